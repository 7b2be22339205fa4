"""`skippy up` with an API key: one key for every door, and on no command line.

With `--openai-api-key-file PATH`: the OpenAI client needs the key (a wrong one is a 401
AuthenticationError), /health stays open, /dashboard and /dashboard/data want it too and, given it,
show every process (each stage's, the driver's and the broker's /metrics want it as well, and the
dashboard sends it), and the page works in a real browser opened at `/dashboard?key=KEY`. The key
is on the command line of no process of the run (every /proc/PID/cmdline of the tree under `skippy
up`, read whole: `ps` cuts long lines) and in no log. With `--openai-api-key KEY` skippy up warns
that its own command line shows the key, and still no child's holds it.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import SkippyServer

from skippy.launcher import Children, read_events
from skippy.telemetry.scrape import scrape
from skippy.telemetry.targets import TARGETS_FILE, read_targets
from skippy.testing.browser import chromium_missing, headless_chromium, text_of

KEY = "sk-skippy-test-key-7f3a"
FLAG_KEY = "sk-skippy-flag-key-19c2"
PROCESSES = {"stage0", "stage1", "broker", "adapter"}
PAGE_WAIT_S = 90.0  # bound on each wait for the page


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (parents read from /proc/PID/stat)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    tree, frontier = [root], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        tree += children
        frontier += children
    return tree


def cmdlines(server: SkippyServer) -> dict[int, list[str]]:
    """Each process's whole argv (/proc/PID/cmdline), `skippy up` and everything below it."""
    found = {}
    for pid in process_tree(server.proc.pid):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
    return found


def children_of(server: SkippyServer, argvs: dict[int, list[str]]) -> dict[str, str]:
    """Each `skippy` child of the run by name (a stage by its config's name, broker, adapter): its command line."""
    named = {}
    for pid, argv in argvs.items():
        if pid == server.proc.pid or "skippy.cli.main" not in argv:
            continue
        command = argv[argv.index("skippy.cli.main") + 1]
        name = Path(argv[argv.index("--config") + 1]).stem if command == "stage" else command
        named[name] = " ".join(argv)
    return named


@pytest.fixture(scope="module")
def keyed(start_up: Callable[..., Any], tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[SkippyServer]:
    key_file = tmp_path_factory.mktemp("secret") / "api.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    with start_up("up-api-key", tiny_llama, "--openai-api-key-file", str(key_file)) as server:
        yield server


def test_up_with_an_api_key_file(keyed: SkippyServer) -> None:
    server = keyed
    assert server.request("GET", "/health").status == 200
    wrong = server.client(api_key="sk-wrong")
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    wrong.close()
    right = server.client(api_key=KEY)
    reply = right.chat.completions.create(model=server.model_id, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    right.close()
    assert reply.choices[0].finish_reason in ("length", "stop")
    for path in ("/dashboard", "/dashboard/data", "/metrics"):
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            assert server.request("GET", path, headers=headers).status == 401, (path, headers)
    data = server.request("GET", "/dashboard/data", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert {p["process"] for p in data["processes"] if p["up"]} == PROCESSES, data["processes"]
    assert set(data["stages"]) == {"stage0", "stage1"} and all(s["scraped"] for s in data["stages"].values())
    targets = {name: url for name, url in read_targets(server.run_dir / TARGETS_FILE) if name != "adapter"}
    assert set(targets) == {"stage0", "stage1", "broker"}
    for name, url in targets.items():  # every process's own /metrics: on loopback, behind the same key
        assert url.startswith("http://127.0.0.1:"), url
        assert scrape(url, timeout_s=10.0) is None and scrape(url, timeout_s=10.0, api_key="sk-wrong") is None, name
        assert scrape(url, timeout_s=10.0, api_key=KEY), name
    argvs = cmdlines(server)
    assert set(children_of(server, argvs)) == PROCESSES, argvs
    assert not [argv for argv in argvs.values() if KEY in " ".join(argv)]  # skippy up's own included
    assert all(KEY not in log.read_text(errors="replace") for log in server.run_dir.glob("*.log"))


def test_the_dashboard_page_works_in_a_browser_given_the_key(keyed: SkippyServer) -> None:
    missing = chromium_missing()
    if missing is not None:
        pytest.skip(f"no headless browser: {missing}")
    from selenium.webdriver.support.ui import WebDriverWait

    base = keyed.base_url.removesuffix("/v1")
    with headless_chromium() as browser:
        browser.get(f"{base}/dashboard?key={KEY}&interval=200")
        wait = WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.1)
        wait.until(lambda d: text_of(d, "status") == "live" and int(text_of(d, "updates") or 0) >= 2)
        assert KEY not in browser.current_url and browser.current_url.endswith("/dashboard?interval=200")
        assert {line.split()[0] for line in text_of(browser, "stages").split("\n")[1:3]} == {"stage0", "stage1"}


def test_a_key_on_the_command_line_is_warned_about_and_reaches_no_child(start_up: Callable[..., Any],
                                                                         tiny_llama: Path) -> None:
    with start_up("up-api-key-flag", tiny_llama, "--openai-api-key", FLAG_KEY) as server:
        assert server.request("GET", "/v1/models", headers={"Authorization": f"Bearer {FLAG_KEY}"}).status == 200
        assert server.request("GET", "/dashboard/data").status == 401
        argvs = cmdlines(server)
        children = children_of(server, argvs)
        assert set(children) == PROCESSES, argvs
        assert not [line for line in children.values() if FLAG_KEY in line]
        assert FLAG_KEY in argvs[server.proc.pid]  # skippy up's own, by the user's choice: hence the warning
        warnings = [line for line in server.stderr_path.read_text().splitlines() if "warning" in line]
        assert warnings == ["skippy up: warning: --openai-api-key: the key is visible to every local user on this"
                            " command line (ps, /proc/PID/cmdline); prefer $SKIPPY_OPENAI_API_KEY or"
                            " --openai-api-key-file PATH"]


def test_the_adapter_warns_about_an_open_non_loopback_bind_and_a_key_on_its_command_line(
        tiny_llama: Path, tmp_path: Path) -> None:
    """`skippy adapter` (what `skippy up` starts): a non-loopback --bind without a key logs one warning
    naming the flag and still serves; --openai-api-key logs that the key shows on its command line."""
    children = Children(tmp_path / "run")
    base = ["adapter", "--broker", f"ipc://{tmp_path}/no-broker.sock", "--model", str(tiny_llama), "--model-id", "tiny"]
    try:
        children.start_process("open", [*base, "--bind", "0.0.0.0:0"])
        children.start_process("flag", [*base, "--bind", "127.0.0.1:0", "--openai-api-key", FLAG_KEY])
        warnings = {name: [e for e in read_events(children.log_path(name)) if e.get("level") == "warning"]
                    for name in ("open", "flag")}
        assert [e["event"] for e in warnings["open"]] == ["api_open"]
        assert warnings["open"][0]["error"].startswith("--bind 0.0.0.0:0: a non-loopback address without an API key")
        assert [e["event"] for e in warnings["flag"]] == ["api_key_on_command_line"]
        host, port = str(children.ready["flag"]["url"]).removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("GET", "/dashboard")
            assert conn.getresponse().status == 401
        finally:
            conn.close()
    finally:
        codes = children.stop()
    assert codes == {"open": 0, "flag": 0}
