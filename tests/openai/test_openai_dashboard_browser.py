"""The live pipeline page in a real headless Chromium: its numbers change while `skippy up` is under load.

Needs Debian's chromium and chromium-driver (CI installs them: .ci/run) and selenium; without them
the test is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skippy.testing.browser import chromium_missing, headless_chromium, load, text_of

PAGE_WAIT_S = 90.0  # bound on each wait for the page; it polls every 200 ms here


def number(driver: Any, element_id: str) -> float:
    text = text_of(driver, element_id).split("/")[0].rstrip("%").strip()
    return float(text) if text not in ("", "–") else 0.0


def test_dashboard_numbers_change_under_load(start_up: Callable[..., Any], tiny_llama: Path, tmp_path: Path) -> None:
    missing = chromium_missing()
    if missing is not None:
        pytest.skip(f"no headless browser: {missing}")
    from selenium.webdriver.support.ui import WebDriverWait

    with start_up("up-dashboard", tiny_llama) as server, headless_chromium() as browser:
        base = server.base_url.removesuffix("/v1")
        browser.get(f"{base}/dashboard?interval=200")
        wait = WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.1)
        wait.until(lambda d: number(d, "updates") >= 2 and text_of(d, "status") == "live")
        idle = {key: number(browser, key) for key in ("completion-tokens", "tok-s", "requests-total")}
        assert idle["tok-s"] == 0.0 and idle["completion-tokens"] == 0.0
        assert {text_of(browser, "stages").split("\n")[i].split()[0] for i in (1, 2)} == {"stage0", "stage1"}
        assert [number(browser, f"stage-{s}-prefill") for s in ("stage0", "stage1")] == [0.0, 0.0]  # no prompt yet
        long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)
        reply = server.request("POST", "/v1/completions", {"model": server.model_id, "prompt": long_prompt, "max_tokens": 2})
        assert reply.status == 200, reply.body[:300]
        wait.until(lambda d: number(d, "stage-stage0-prefill") > 0 and number(d, "stage-stage1-prefill") > 0)
        with load(base, server.model_id, streams=2) as finished:
            wait.until(lambda d: number(d, "tok-s") > 0 and number(d, "completion-tokens") > idle["completion-tokens"]
                       and number(d, "stage-stage1-util") > 0 and number(d, "stage-stage0-util") > 0)
            wait.until(lambda d: number(d, "requests-total") > idle["requests-total"] and number(d, "ttft-ms") > 0)
            shot = tmp_path / "dashboard.png"
            assert browser.save_screenshot(str(shot)) and shot.read_bytes().startswith(b"\x89PNG")
        assert sum(finished) > 0
        wait.until(lambda d: number(d, "completion-tokens") >= 48 * sum(finished))  # every finished request counted
