"""Whatever dies under `skippy up` (the broker, the adapter, stage 0), no stream ends without a finish
reason or an error event, the dead process is restarted, and a new request is served on the same URL.

Nothing is lost when stage 0 or the broker dies: the adapter resumes each stream's request from the
tokens it has sent (skippy.adapter.resume) once the pipeline is back, and every stream completes with the
text of an undisturbed run of the same greedy request, each token once. A dead adapter takes its HTTP
connections with it (they drop; the clients reconnect).

Streams are raw HTTP reading SSE; each is filed by its last event: a chunk with a finish reason, an
`{"error": ...}` event, or neither (a bare end: the failure these tests exist to catch). Stages run
with a wire delay so the streams are still generating when the kill comes. The run is `--deterministic`: a
resumed stream's KV lands in other cells and beside other rows than the undisturbed run's, and without the
mode llama.cpp rounds such rows differently (docs/deterministic.md); a near-tie of the tiny model then flips.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from up_helpers import SkippyServer, wait_readyz

STREAMS = 3
WITHIN_S = 90.0  # bounded waits (not timing claims)
MAX_TOKENS = 200


@dataclass
class StreamResult:
    started: threading.Event = field(default_factory=threading.Event)  # its first token arrived
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False  # [DONE] came
    broken: str = ""  # the connection failed (how)

    @property
    def finish_reason(self) -> str | None:
        return next((c["finish_reason"] for e in self.events for c in e.get("choices", []) if c.get("finish_reason")), None)

    @property
    def text(self) -> str:
        return "".join(c.get("delta", {}).get("content") or "" for e in self.events for c in e.get("choices", []))

    @property
    def error(self) -> dict[str, Any] | None:
        return next((e["error"] for e in self.events if "error" in e), None)


def _stream(server: SkippyServer, result: StreamResult, max_tokens: int = MAX_TOKENS) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=WITHIN_S)
    try:
        conn.request("POST", "/v1/chat/completions", headers={"content-type": "application/json"}, body=json.dumps(
            {"model": server.model_id, "stream": True, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
             "messages": [{"role": "user", "content": "tell me a story"}]}))
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                result.done = True
                break
            event = json.loads(line[len("data: "):])
            result.events.append(event)
            if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                result.started.set()
        if not result.done:
            result.broken = "the connection closed without [DONE]"
    except (OSError, http.client.HTTPException) as exc:
        result.broken = type(exc).__name__
    finally:
        result.started.set()
        conn.close()


@dataclass
class OpenStreams:
    results: list[StreamResult]
    threads: list[threading.Thread]

    def join(self) -> list[StreamResult]:
        for thread in self.threads:
            thread.join(WITHIN_S)
            assert not thread.is_alive(), "a stream hung"
        return self.results


def open_streams(server: SkippyServer) -> OpenStreams:
    """STREAMS streams, returned once each has its first token."""
    results = [StreamResult() for _ in range(STREAMS)]
    threads = [threading.Thread(target=_stream, args=(server, r), daemon=True) for r in results]
    for thread in threads:
        thread.start()
    for result in results:
        assert result.started.wait(WITHIN_S)
        assert not result.broken and not result.done, result
    return OpenStreams(results, threads)


def pid_of(server: SkippyServer, pattern: str) -> int:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    assert len(out) == 1, (pattern, out)
    return int(out[0])


def kill(pid: int) -> None:
    subprocess.run(["kill", "-KILL", str(pid)], check=True)


def wait_stderr(server: SkippyServer, text: str) -> None:
    deadline = time.monotonic() + WITHIN_S
    while text not in server.stderr_path.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in skippy up's stderr\n{server.log_tail()}"
        time.sleep(0.1)  # poll interval of a bounded poll


def served(server: SkippyServer) -> None:
    """A new request, on the URL `skippy up` announced first, completes."""
    wait_readyz(server, WITHIN_S)
    result = StreamResult()
    _stream(server, result, max_tokens=4)
    assert result.done and result.finish_reason == "length" and result.error is None, result


def resumed(server: SkippyServer) -> int:
    return (server.run_dir / "adapter.log").read_text().count('"request_resumed"')


def assert_nothing_lost(results: list[StreamResult], undisturbed: str, server: SkippyServer, before: int) -> None:
    """Every stream completed with the undisturbed text; each was resumed (`before`: resumed requests until then)."""
    for result in results:
        assert result.done and not result.broken and result.error is None, result
        assert result.finish_reason == "length" and result.text == undisturbed, result
    assert resumed(server) - before >= len(results), server.log_tail()


@pytest.fixture(scope="module")
def up(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    with start_up("up-deaths", tiny_llama, "--lane-count", "4", "--deterministic", "--",
                  "--downstream-wire-delay-ms", "20") as server:
        yield server


@pytest.fixture(scope="module")
def undisturbed(up: SkippyServer) -> str:
    """The text of the streams' greedy request when nothing dies."""
    result = StreamResult()
    _stream(up, result)
    assert result.done and result.finish_reason == "length", result
    return result.text


def test_broker_killed_mid_stream(up: SkippyServer, undisturbed: str) -> None:
    broker = pid_of(up, f"skippy.cli.main broker --bind ipc://{up.run_dir}/broker.sock")
    streams, before = open_streams(up), resumed(up)
    kill(broker)
    assert_nothing_lost(streams.join(), undisturbed, up, before)
    wait_stderr(up, "broker restarted (restart 1")
    assert pid_of(up, f"skippy.cli.main broker --bind ipc://{up.run_dir}/broker.sock") != broker
    served(up)


def test_adapter_killed_comes_back_on_the_same_port(up: SkippyServer) -> None:
    adapter = pid_of(up, f"skippy.cli.main adapter --broker ipc://{up.run_dir}/broker.sock")
    streams = open_streams(up)
    kill(adapter)
    for result in streams.join():  # the process that would write an error event is gone: the connection drops
        assert result.broken and not result.done and result.finish_reason is None, result
    wait_stderr(up, "adapter restarted (restart 1")
    served(up)  # same host and port as first announced
    assert up.proc.poll() is None


def test_stage0_killed_mid_stream(up: SkippyServer, undisturbed: str) -> None:
    wait_readyz(up, WITHIN_S)
    stage0 = up.stage_pids("stage0")
    assert len(stage0) == 1
    streams, before = open_streams(up), resumed(up)
    kill(stage0[0])
    assert_nothing_lost(streams.join(), undisturbed, up, before)
    wait_stderr(up, "stage0 restarted (restart 1")
    served(up)
    assert up.stage_pids("stage0") not in ([], stage0)


def test_a_request_sent_while_stage0_restarts_waits_and_completes(up: SkippyServer, undisturbed: str) -> None:
    """Sent right after stage 0 is killed (no pipeline is ready), a request is not refused with 503: the adapter
    waits for the restart (within --openai-resume-timeout-s) and it completes with the undisturbed text."""
    wait_readyz(up, WITHIN_S)
    stage0, before = up.stage_pids("stage0"), resumed(up)
    kill(stage0[0])
    result = StreamResult()
    _stream(up, result)
    assert result.done and not result.broken and result.error is None, result
    assert result.finish_reason == "length" and result.text == undisturbed, result
    assert up.stage_pids("stage0") not in ([], stage0)
    # it found no pipeline ready and waited, or was sent before the broker knew and was resumed
    assert '"pipeline_waited"' in (up.run_dir / "adapter.log").read_text() or resumed(up) > before
