"""Headless Chromium for looking at skippy's pages: Debian's `chromium` + `chromium-driver`, driven by selenium.

`chromium_missing()` says why no browser can run here (None when one can); `headless_chromium()`
starts one with a fresh profile directory and the flags that keep it off the network (no
background networking, component updates or sync) and removes the profile afterwards. Used by the
dashboard's browser test and by `scripts/dashboard-screenshot`, with `load()`, which keeps a server
busy with completions (bounded in count) while the page is watched.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["CHROMEDRIVER", "CHROMIUM", "chromium_missing", "headless_chromium", "load", "text_of"]

CHROMIUM = os.environ.get("SKIPPY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SKIPPY_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage")


def chromium_missing() -> str | None:
    """Why a headless Chromium cannot be driven here (None: it can)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} not found: apt-get install -y chromium chromium-driver (Debian package {package})"
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed: pip install selenium (in the test extras)"
    return None


@contextmanager
def headless_chromium(width: int = 1280, height: int = 1100) -> Iterator[Any]:
    """A selenium WebDriver on the system's Chromium, in a fresh profile directory removed afterwards."""
    from selenium import webdriver

    profile = tempfile.mkdtemp(prefix="skippy-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def text_of(driver: Any, element_id: str) -> str:
    """The visible text of the element with `element_id` ('' while there is none), read in one step in the page:
    the page rebuilds some elements on every refresh, and a found element read afterwards can be a replaced one
    (seen in CI: StaleElementReferenceException on a stage's utilisation under load)."""
    script = "const e = document.getElementById(arguments[0]); return e ? e.innerText : '';"
    return str(driver.execute_script(script, element_id))


@contextmanager
def load(base_url: str, model_id: str, *, streams: int = 2, max_requests: int = 200, max_tokens: int = 48) -> Iterator[list[int]]:
    """Keep `streams` completions running against `base_url` (http://HOST:PORT) until the block ends or
    `max_requests` have been sent; yields the per-stream counts of finished requests."""
    stop = threading.Event()
    done = [0] * streams
    budget = iter(range(max_requests))
    body = json.dumps({"model": model_id, "prompt": "Count slowly:", "max_tokens": max_tokens, "ignore_eos": True}).encode()

    def run(i: int) -> None:
        while not stop.is_set() and next(budget, None) is not None:
            request = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()
            done[i] += 1

    threads = [threading.Thread(target=run, args=(i,), name=f"load-{i}", daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    try:
        yield done
    finally:
        stop.set()
        for thread in threads:
            thread.join(180)
