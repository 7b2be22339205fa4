"""`skippy broker`: flags resolved and validated (one-line ConfigErrors naming the flag), and the
process itself (`python -m skippy.cli.main broker`): `ready` once bound, requests served, SIGTERM
fails what is running with "unavailable" ("broker stopping"), logs `stopped`, exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import zmq.asyncio
from broker_helpers import BrokerClient, PipelineProcs, run

from skippy.cli.broker import main, register, resolve_broker_settings, run_broker
from skippy.config import AdmissionOptions, ConfigError
from skippy.launcher import read_events


@pytest.fixture(autouse=True)
def _logging_back_to_defaults() -> Iterator[None]:
    """`main()` run in-process points structlog at this test's captured stderr, closed after it: undo that,
    so a later test's in-process logging (a secured context's `links_secured`) has somewhere to go."""
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="skippy")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["broker", *argv])


def test_flags_resolve_to_settings(shared_pipeline: PipelineProcs) -> None:
    args = parse("--bind", "127.0.0.1:0", "--pipeline", str(shared_pipeline.topology), "--pipeline",
                 str(shared_pipeline.topology), "--openai-generation-concurrency", "2",
                 "--openai-generation-queue-capacity", "0", "--openai-generation-admission-timeout-secs", "1.5",
                 "--openai-adaptive-generation-concurrency", "--openai-adaptive-generation-min-concurrency", "2",
                 "--telemetry-level", "debug")
    assert args.run is run_broker
    settings = resolve_broker_settings(args)
    assert settings.bind == "tcp://127.0.0.1:0"
    assert settings.pipelines == (shared_pipeline.request_endpoint,) * 2 and settings.stage0_ids == ("stage0",) * 2
    admission = settings.admission
    assert (admission.generation_concurrency, admission.queue_capacity, admission.admission_timeout_secs) == (2, 0, 1.5)
    assert (admission.adaptive, admission.adaptive_min_concurrency, str(settings.telemetry_level)) == (True, 2, "debug")
    defaults = resolve_broker_settings(parse("--bind", "ipc:///tmp/b.sock",
                                             "--pipeline", str(shared_pipeline.topology)))
    assert defaults.admission == AdmissionOptions()


@pytest.mark.parametrize(("flags", "message"), [
    (("--openai-generation-concurrency", "0"), "--openai-generation-concurrency must be > 0, got 0"),
    (("--openai-generation-admission-timeout-secs", "-1"),
     "--openai-generation-admission-timeout-secs must be finite and >= 0, got -1"),
    (("--openai-generation-queue-capacity", "-2"), "--openai-generation-queue-capacity must be >= 0, got -2"),
    (("--openai-adaptive-generation-min-concurrency", "2"),
     "--openai-adaptive-generation-min-concurrency requires --openai-adaptive-generation-concurrency"),
    (("--openai-generation-concurrency", "1", "--openai-adaptive-generation-concurrency",
      "--openai-adaptive-generation-min-concurrency", "2"),
     "--openai-adaptive-generation-min-concurrency must be <= --openai-generation-concurrency (1), got 2"),
    (("--telemetry-level", "loud"), "--telemetry-level must be one of off | summary | debug, got 'loud'"),
])
def test_bad_flags_are_one_line_errors_naming_the_flag(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        resolve_broker_settings(parse("--bind", "tcp://127.0.0.1:0", "--pipeline", str(tmp_path / "missing.json"),
                                      *flags))
    assert str(error.value) == message


def test_missing_bind_pipeline_or_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--bind is required"):
        resolve_broker_settings(parse("--pipeline", "t.json"))
    with pytest.raises(ConfigError, match="--pipeline is required"):
        resolve_broker_settings(parse("--bind", "tcp://127.0.0.1:0"))
    assert main(["--bind", "tcp://127.0.0.1:0", "--pipeline", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err == f"skippy broker: error: {tmp_path / 'missing.json'}: config file not found\n"


def test_address_in_use_is_a_one_line_error(shared_pipeline: PipelineProcs, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        assert main(["--bind", bind, "--pipeline", str(shared_pipeline.topology)]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"skippy broker: error: --bind {bind}: cannot bind (")


def wait_for_event(log: Path, event: str, proc: subprocess.Popen[Any], timeout_s: float = 20.0) -> dict[str, Any]:
    """The first `event` line in the process's log (a bounded poll of the file, like the launcher's)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [e for e in read_events(log) if e.get("event") == event]
        if found:
            return found[0]
        assert proc.poll() is None, f"broker exited with {proc.returncode}: {log.read_text()[-2000:]}"
        time.sleep(0.05)
    raise AssertionError(f"no {event!r} line within {timeout_s} s: {log.read_text()[-2000:]}")


def test_broker_process_serves_and_stops_cleanly_on_sigterm(shared_pipeline: PipelineProcs, tmp_path: Path) -> None:
    endpoint, log = f"ipc://{tmp_path}/broker.sock", tmp_path / "broker.log"
    cmd = [sys.executable, "-m", "skippy.cli.main", "broker", "--bind", endpoint,
           "--pipeline", str(shared_pipeline.topology), "--openai-generation-concurrency", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        ready = wait_for_event(log, "ready", proc)
        assert (ready["role"], ready["stage_id"], ready["endpoint"]) == ("broker", "broker", endpoint)
        assert ready["pipelines"] == [shared_pipeline.request_endpoint]
        wait_for_event(log, "pipeline_ready", proc)

        async def body() -> None:
            ctx = zmq.asyncio.Context()
            client = BrokerClient(endpoint, ctx)
            try:
                done = await (await client.submit(max_tokens=8)).finished()
                assert done.finish_reason == "length"
                status = await client.status()
                assert (status.ready, status.lane_count, status.running) == (True, 1, 0)
                running = await client.submit(max_tokens=480)
                await running.decoding()
                proc.send_signal(signal.SIGTERM)
                final = await running.finished()
                assert (final.finish_reason, final.code, final.error) == ("error", "unavailable", "broker stopping")
                assert await asyncio.wait_for(asyncio.to_thread(proc.wait, 15), 20) == 0
            finally:
                client.close()
                ctx.term()

        run(body())
        stopped = [e for e in read_events(log) if e.get("event") == "stopped"]
        assert stopped and stopped[0]["outcomes"] == {"length": 1, "unavailable": 1}, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_plain_non_loopback_bind_is_refused_unless_insecure_links(shared_pipeline: PipelineProcs,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Anyone who reaches a plain ROUTER submits requests: beyond loopback, without link keys, the broker
    refuses to start (one line naming --insecure-links) unless told --insecure-links."""
    bind = "tcp://0.0.0.0:0"
    with pytest.raises(ConfigError, match="non-loopback address without link keys.*--insecure-links"):
        resolve_broker_settings(parse("--bind", bind, "--pipeline", str(shared_pipeline.topology)))
    assert main(["--bind", bind, "--pipeline", str(shared_pipeline.topology)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"skippy broker: error: broker --bind {bind} is a non-loopback")
    assert "--insecure-links" in lines[0]
    loopback = resolve_broker_settings(parse("--bind", "tcp://127.0.0.1:0", "--pipeline", str(shared_pipeline.topology)))
    assert (loopback.serve_keys, loopback.insecure_links, loopback.metrics_bind) == (None, False, "127.0.0.1")
    allowed = resolve_broker_settings(parse("--bind", bind, "--pipeline", str(shared_pipeline.topology),
                                            "--insecure-links"))
    assert allowed.insecure_links and allowed.serve_keys is None
    with pytest.raises(ConfigError, match="--metrics-bind must be a host"):
        resolve_broker_settings(parse("--bind", bind, "--pipeline", str(shared_pipeline.topology), "--metrics-bind",
                                      "127.0.0.1:9000"))


def test_with_insecure_links_it_starts_and_says_so(shared_pipeline: PipelineProcs, tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    cmd = [sys.executable, "-m", "skippy.cli.main", "broker", "--bind", "tcp://0.0.0.0:0", "--insecure-links",
           "--pipeline", str(shared_pipeline.topology)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        ready = wait_for_event(log, "ready", proc)
        assert ready["endpoint"].startswith("tcp://0.0.0.0:")
        assert ready["metrics_url"].startswith("http://127.0.0.1:")  # /metrics stays on loopback
        warning = wait_for_event(log, "insecure_links", proc)
        assert warning["level"] == "warning" and "neither authenticated nor encrypted" in warning["error"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert [e for e in read_events(log) if e.get("event") == "stopped"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
