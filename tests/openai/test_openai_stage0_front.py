"""The reference's stage-0 surface: `skippy stage --config stage0 --topology T --openai-bind-addr ...`
serves the OpenAI API for an already running pipeline (stage 0 starts broker + adapter as children),
with the adapter's flags (here `--openai-cors-origins`) handed to it as `skippy up` hands them."""

from __future__ import annotations

import http.client
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from skippy.launcher import StageProcesses, read_events, write_local_topology


def preflight_allow_origin(url: str, origin: str) -> str | None:
    """Access-Control-Allow-Origin of a CORS preflight to /v1/chat/completions from `origin`."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("OPTIONS", "/v1/chat/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 204
        return resp.getheader("access-control-allow-origin")
    finally:
        conn.close()


def start_front(stages: StageProcesses, configs: list[Path], topology: Path, *flags: str) -> dict:
    """Start stage 1, then stage 0 with `--openai-bind-addr` and `flags`; its `openai_ready` line (bounded poll)."""
    stages.start()  # stage 1 only
    stages.start_process("stage0", ["stage", "--config", str(configs[0]), "--topology", str(topology),
                                    "--openai-bind-addr", "127.0.0.1:0", *flags])
    stage0_log = stages.log_path("stage0")
    front: dict = {}
    deadline = time.monotonic() + 60
    while not front and not stages.dead() and time.monotonic() < deadline:  # bounded poll
        front = next((e for e in read_events(stage0_log) if e.get("event") == "openai_ready"), {})
        time.sleep(0.05)
    assert front, stage0_log.read_text()[-2000:]
    return front


def front_stages(tmp_path: Path, model: Path, skippy_cache_dir: Path) -> tuple[StageProcesses, list[Path], Path]:
    topology, configs = write_local_topology(tmp_path / "t", model, 6, [3], lane_count=2, model_id="tiny-front")
    return StageProcesses(topology, configs, tmp_path / "run", env={"SKIPPY_CACHE_DIR": str(skippy_cache_dir)}), configs, topology


def test_stage0_openai_bind_addr_serves_the_api(tiny_model: Callable[..., Path], tmp_path: Path,
                                                skippy_cache_dir: Path) -> None:
    stages, configs, topology = front_stages(tmp_path, tiny_model("llama"), skippy_cache_dir)
    front: dict = {}
    try:
        front = start_front(stages, configs, topology, "--openai-generation-concurrency", "1",
                            "--openai-cors-origins", "http://ui.example")
        url = front["url"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        reply = client.completions.create(model="tiny-front", prompt="Hello world", max_tokens=5, temperature=0,
                                            extra_body={"ignore_eos": True})
        assert reply.usage is not None and reply.usage.completion_tokens == 5
        assert reply.choices[0].finish_reason == "length"
        with pytest.raises(openai.NotFoundError) as unknown:
            client.completions.create(model="other", prompt="x", max_tokens=1)
        assert (unknown.value.code, unknown.value.param) == ("model_not_found", "model")
        client.close()
        for origin, allowed in (("http://ui.example", "http://ui.example"), ("http://other.example", None)):
            assert preflight_allow_origin(url, origin) == allowed
    finally:
        codes = stages.stop()
    assert codes == {"stage1": 0, "stage0": 0}
    left = subprocess.run(["pgrep", "-f", str(front["logs"])], capture_output=True, text=True).stdout.split()
    assert not left, f"broker/adapter of stage 0 still running: {left}"
    stopped = [e for e in read_events(stages.log_path("stage0")) if e.get("event") == "stopped"]
    assert {e.get("stage_id") for e in stopped} >= {"stage0"}


def test_stage0_front_restarts_a_killed_broker_and_adapter(tiny_model: Callable[..., Path], tmp_path: Path,
                                                           skippy_cache_dir: Path) -> None:
    stages, configs, topology = front_stages(tmp_path, tiny_model("llama"), skippy_cache_dir)
    try:
        front = start_front(stages, configs, topology)
        stage0_log = stages.log_path("stage0")
        for child in ("broker", "adapter"):
            pids = subprocess.run(["pgrep", "-f", f"skippy.cli.main {child} .*{front['logs']}"], capture_output=True,
                                  text=True).stdout.split()
            assert len(pids) == 1, pids
            subprocess.run(["kill", "-KILL", pids[0]], check=True)
            deadline = time.monotonic() + 60
            while not any(e.get("event") == "child_restarted" and e.get("child") == child
                          for e in read_events(stage0_log)):  # bounded poll
                assert time.monotonic() < deadline and not stages.dead(), stage0_log.read_text()[-2000:]
                time.sleep(0.05)
            client = openai.OpenAI(base_url=f"{front['url']}/v1", api_key="x", max_retries=0)
            reply = None
            while reply is None:  # bounded poll: the restarted broker is ready once it hears stage 0
                try:
                    reply = client.completions.create(model="tiny-front", prompt="Hi", max_tokens=3,
                                                      extra_body={"ignore_eos": True})
                except openai.APIStatusError as exc:
                    assert exc.status_code == 503 and time.monotonic() < deadline, exc
                    time.sleep(0.1)
            client.close()
            assert reply.choices[0].finish_reason == "length", child
    finally:
        codes = stages.stop()
    assert codes == {"stage1": 0, "stage0": 0}
    left = subprocess.run(["pgrep", "-f", str(front["logs"])], capture_output=True, text=True).stdout.split()
    assert not left, f"broker/adapter of stage 0 still running: {left}"
