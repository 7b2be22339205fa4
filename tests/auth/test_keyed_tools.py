"""Everything that talks to a keyed pipeline does so with the topology's keys: `skippy wire`,
`skippy generate --topology` and stage 0's own front (`--openai-bind-addr`, its broker) with the client
pair; and a stage started with `--insecure-links` on a topology beyond loopback logs a warning, while
without the flag it refuses to start."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from auth_helpers import add_keys, logged, until_logged
from pipeline_helpers import Pipeline, run

from skippy.launcher import Children, LaunchError, write_local_topology


def skippy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skippy.cli.main", *args], capture_output=True, text=True, timeout=120)


def test_wire_and_generate_use_the_client_pair(tiny_model: Callable[..., Path],
                                               keyed_pipeline: Callable[..., Pipeline]) -> None:
    pipe = keyed_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=256)
    wire = skippy("wire", str(pipe.topology), "--delay-ms", "1.5")
    assert wire.returncode == 0, wire.stderr
    changed = run(until_logged(pipe, "stage0", "wire_changed"))
    assert changed["delay_ms"] == 1.5
    out = skippy("generate", "--topology", str(pipe.topology), "--prompt", "Hello", "--max-tokens", "4")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Hello") and "generated" in out.stderr
    assert len(logged(pipe, "stage0", "request_done")) == 1


def test_stage0s_own_front_reaches_a_keyed_pipeline(tiny_model: Callable[..., Path],
                                                    make_pipeline: Callable[..., Pipeline]) -> None:
    """`skippy stage ... --openai-bind-addr`: its broker finds the client pair through the topology it was
    handed (keys_dir made absolute, so the copy in the front's run directory still finds it)."""
    pipe = make_pipeline(tiny_model("llama"), [3], start=False, include_stage0=True, lane_count=2, ctx_size=256)
    add_keys(pipe)
    pipe.stages.first_flags = ["--openai-bind-addr", "127.0.0.1:0"]
    pipe.start()
    front = run(until_logged(pipe, "stage0", "openai_ready"))
    host, port = front["url"].removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        deadline = time.monotonic() + 60.0
        while True:  # bounded poll: the broker learns readiness from stage 0's status
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                break
            assert time.monotonic() < deadline, "front not ready"
            time.sleep(0.05)  # poll interval of a bounded poll
        conn.request("POST", "/v1/completions", json.dumps({"model": "model", "prompt": "hi", "max_tokens": 3,
                                                                 "ignore_eos": True}),
                     {"content-type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        assert json.loads(response.read())["usage"]["completion_tokens"] == 3
    finally:
        conn.close()


def _remote_topology(tmp_path: Path, model: Path) -> tuple[Path, Path]:
    """A 2-stage topology whose stage 1 is at a non-loopback address; (topology, stage 1 config)."""
    topology, configs = write_local_topology(tmp_path / "t", model, 6, [3], lane_count=1, ctx_size=64)
    data = json.loads(topology.read_text())
    data["stages"][1]["endpoint"] = "tcp://10.77.250.2:19410"
    topology.write_text(json.dumps(data))
    config = json.loads(configs[1].read_text())
    config["bind_addr"] = "tcp://10.77.250.2:19410"
    configs[1].write_text(json.dumps(config))
    return topology, configs[1]


def test_insecure_links_is_refused_without_the_flag_and_logged_with_it(tmp_path: Path,
                                                                       tiny_model: Callable[..., Path]) -> None:
    topology, config = _remote_topology(tmp_path, tiny_model("llama"))
    children = Children(tmp_path / "run")
    args = ["stage", "--config", str(config), "--topology", str(topology), "--bind-addr", f"ipc://{tmp_path}/s1.sock"]
    try:
        with pytest.raises(LaunchError, match="exited with code 2.*without link keys.*--insecure-links"):
            children.start_process("refused", args)
        children.start_process("insecure", [*args, "--insecure-links"])
        warning = [e for e in _events(children, "insecure") if e.get("event") == "insecure_links"]
        assert warning and warning[0]["level"] == "warning" and "neither authenticated nor encrypted" in warning[0]["error"]
    finally:
        codes = children.stop()
    assert codes["insecure"] == 0


def _events(children: Children, name: str) -> list[dict[str, object]]:
    from skippy.launcher import read_events

    return read_events(children.log_path(name))
