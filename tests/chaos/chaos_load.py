"""Chaos under load: streams of chat completions against `skippy up` while a stage is killed (SIGKILL)
and `skippy up` restarts it, with the figures the issue asks for.

`run_chaos(server, ...)` runs `streams` client threads for `duration_s`; each sends the same greedy
streaming chat completion one after another and files every one as completed (a finish reason came), errored
(an HTTP error, an error event in the stream, a refused or dropped connection) or hung (no byte for
`request_timeout_s`, the client's read timeout), with its text and the longest pause between two of its
chunks. Meanwhile the main thread kills the stages of `kills` in turn at evenly spaced times and, after
each kill, waits (bounded) for the restart to show in /metrics and for /readyz to say 200 again, then
sends a probe request of its own. The survivors' resident memory is read after a warm-up and at the end;
the replays are read from stage 0's log (`request_replay`, `request_replay_submitted`), the resumed requests
from the adapter's (`request_resumed`).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import openai
from up_helpers import SkippyServer, wait_readyz

from skippy.launcher import read_events

WARMUP_FRACTION = 0.15
ERROR_PAUSE_S = 0.2  # a client's pause after an error (load shaping: no tight loop of 503s while a stage is down)
BACK_WITHIN_S = 60.0  # bounded waits for a restart (not timing claims)


@dataclass
class Outcome:
    kind: str  # completed | errored | hung
    started: float  # monotonic
    seconds: float
    tokens: int
    detail: str = ""
    text: str = ""
    longest_pause_s: float = 0.0  # between two chunks of the stream (a kill's pause shows here)
    longest_pause_end: float = 0.0  # when it ended (monotonic)


@dataclass
class Restart:
    stage: str
    killed_pid: int
    at_s: float  # since the load started
    supervisor_restart_s: float | None = None  # death -> ready line of the new process (skippy up's own figure)
    serving_again_s: float | None = None  # kill -> stage 0 logged `stage_back` and /readyz says 200
    probe: str = ""  # a request sent right after /readyz said 200 again: completed | errored | hung


@dataclass
class ChaosFigures:
    duration_s: float
    streams: int
    seed: int = 0  # of the kill moments (SKIPPY_CHAOS_SEED replays a run's)
    sent: int = 0
    completed: int = 0
    errored: int = 0
    hung: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    restarts: list[Restart] = field(default_factory=list)
    completed_after_each_restart: list[int] = field(default_factory=list)
    longest_request_s: float = 0.0
    longest_pause_s: float = 0.0
    distinct_texts: int = 0  # among completed greedy streams: 1 when every one equals the undisturbed run
    replays: int = 0  # requests replayed by stage 0 (paused ones, `request_replay`; ones submitted to resume too)
    replayed_tokens: int = 0  # tokens prefilled again for them
    resumed: int = 0  # requests the adapter resumed after stage 0 or the broker died
    pauses: list[dict[str, Any]] = field(default_factory=list)  # per kill: the streams it paused, p50 / max pause
    rss_mib: dict[str, tuple[float, float]] = field(default_factory=dict)  # survivor: (after warm-up, at the end)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _one_request(client: openai.OpenAI, model: str, max_tokens: int) -> Outcome:
    started = last = time.monotonic()
    tokens, finish, kind, detail, texts, pause, pause_end = 0, None, "errored", "", [], 0.0, 0.0
    try:
        stream = client.chat.completions.create(model=model, max_tokens=max_tokens, stream=True, temperature=0.0,
                                                messages=[{"role": "user", "content": "tell me a story"}],
                                                extra_body={"ignore_eos": True})
        for chunk in stream:
            now = time.monotonic()
            if now - last > pause:
                pause, pause_end = now - last, now
            last = now
            if chunk.choices:
                tokens += 1 if chunk.choices[0].delta.content else 0
                texts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        kind, detail = ("completed", str(finish)) if finish else ("errored", "stream ended without a finish reason")
    except openai.APITimeoutError:
        kind, detail = "hung", "no byte within the read timeout"
    except openai.APIStatusError as exc:
        detail = f"http {exc.status_code} {exc.code}"
    except openai.APIError as exc:  # an error event in the stream, or the connection refused / dropped
        detail = type(exc).__name__ if isinstance(exc, openai.APIConnectionError) else f"stream error {exc.code}"
    return Outcome(kind, started, time.monotonic() - started, tokens, detail, "".join(texts), round(pause, 3), pause_end)


def _worker(server: SkippyServer, until: float, max_tokens: int, timeout_s: float, out: list[Outcome],
            stop: threading.Event) -> None:
    client = server.client(timeout=timeout_s)
    try:
        while time.monotonic() < until and not stop.is_set():
            outcome = _one_request(client, server.model_id, max_tokens)
            out.append(outcome)
            if outcome.kind != "completed":
                stop.wait(ERROR_PAUSE_S)
    finally:
        client.close()


def metric(server: SkippyServer, name: str, stage: str) -> float | None:
    """The value of `name{stage="..."}` on the adapter's /metrics (None: not there)."""
    text = server.request("GET", "/metrics").body.decode()
    found = re.search(rf'^{name}{{stage="{stage}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def wait_metric(server: SkippyServer, name: str, stage: str, value: float) -> None:
    """Bounded poll of /metrics until `name{stage}` is `value`."""
    deadline = time.monotonic() + BACK_WITHIN_S
    while (got := metric(server, name, stage)) != value:
        assert time.monotonic() < deadline, f"{name}{{stage={stage}}} is {got}, not {value}\n{server.log_tail()}"
        time.sleep(0.1)  # poll interval of a bounded poll


FRONT = ("broker", "adapter")  # skippy up's other children, found by their command lines


def pid_of(server: SkippyServer, name: str) -> int:
    """The pid of the run's process `name`: a stage id, "broker" or "adapter"."""
    if name not in FRONT:
        (pid,) = server.stage_pids(name)
        return pid
    broker = f"ipc://{server.run_dir}/broker.sock"
    pattern = f"broker --bind {broker}" if name == "broker" else f"adapter --broker {broker}"
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout.split()
    assert len(found) == 1, (name, found)
    return int(found[0])


def kill_stage(server: SkippyServer, stage_id: str) -> int:
    """SIGKILL the process `stage_id` (a stage, or the broker); its pid."""
    pid = pid_of(server, stage_id)
    os.kill(pid, signal.SIGKILL)
    return pid


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def survivor_pids(server: SkippyServer, killed: set[str], stages: list[str]) -> dict[str, int]:
    """Every process of the run that is not killed: the other stages, the broker and the adapter."""
    return {name: pid_of(server, name) for name in (*stages, *FRONT) if name not in killed}


def _stage0_back(server: SkippyServer) -> int:
    return sum(1 for e in read_events(server.run_dir / "stage0.log") if e.get("event") == "stage_back")


def kill_and_wait_back(server: SkippyServer, stage: str, number: int, started: float) -> Restart:
    """Kill `stage`; wait for skippy up's restart, for stage 0 to have greeted the chain again when a later stage
    died (a restart faster than the heartbeat bound leaves /readyz at 200 throughout), for /readyz; then a probe
    request."""
    back = _stage0_back(server)
    pid = kill_stage(server, stage)
    killed = time.monotonic()
    restart = Restart(stage, pid, round(killed - started, 2))
    wait_metric(server, "skippy_stage_restarts_total", stage, float(number))
    restart.supervisor_restart_s = metric(server, "skippy_stage_last_restart_seconds", stage)
    deadline = killed + BACK_WITHIN_S
    while stage not in ("stage0", *FRONT) and _stage0_back(server) == back:
        assert time.monotonic() < deadline, f"stage 0 did not greet {stage} again\n{server.log_tail()}"
        time.sleep(0.05)  # poll interval of a bounded poll
    wait_readyz(server, BACK_WITHIN_S)
    restart.serving_again_s = round(time.monotonic() - killed, 2)
    client = server.client(timeout=BACK_WITHIN_S)
    try:
        restart.probe = _one_request(client, server.model_id, 4).kind
    finally:
        client.close()
    return restart


def run_chaos(server: SkippyServer, *, kills: list[str], stages: list[str], duration_s: float, streams: int = 8,
              max_tokens: int = 16, request_timeout_s: float = 30.0) -> ChaosFigures:
    """`kills`: the processes to kill, in order, each at a random moment near its even slot over the run (the
    seed is `SKIPPY_CHAOS_SEED`, else drawn, and reported with the figures)."""
    seed = int(os.environ.get("SKIPPY_CHAOS_SEED") or random.SystemRandom().randrange(1 << 31))
    figures, rng = ChaosFigures(duration_s, streams, seed=seed), random.Random(seed)
    outcomes: list[Outcome] = []
    stop = threading.Event()
    started = time.monotonic()
    workers = [threading.Thread(target=_worker, args=(server, started + duration_s, max_tokens, request_timeout_s,
                                                      outcomes, stop), name=f"chaos-{i}") for i in range(streams)]
    for worker in workers:
        worker.start()
    try:
        stop.wait(duration_s * WARMUP_FRACTION)
        pids = survivor_pids(server, set(kills), stages)
        before = {name: rss_mib(pid) for name, pid in pids.items()}
        spacing = duration_s / (len(kills) + 1)
        for number, stage in enumerate(kills, 1):  # at a random moment within a quarter spacing of its even slot
            at = spacing * (number + rng.uniform(-0.25, 0.25))
            stop.wait(max(0.0, started + at - time.monotonic()))
            figures.restarts.append(kill_and_wait_back(server, stage, kills[:number].count(stage), started))
    finally:
        for worker in workers:
            worker.join(duration_s + request_timeout_s + BACK_WITHIN_S)  # bounded: a stuck client fails below
        stop.set()
    assert not any(w.is_alive() for w in workers), "a client thread never finished"
    figures.rss_mib = {name: (round(before[name], 1), round(rss_mib(pid), 1)) for name, pid in pids.items()}
    _count(figures, outcomes, started)
    stage0 = read_events(server.run_dir / "stage0.log")
    replays = [e for e in stage0 if e.get("event") in ("request_replay", "request_replay_submitted")]
    figures.replays, figures.replayed_tokens = len(replays), sum(e["replayed_tokens"] for e in replays)
    figures.resumed = sum(1 for e in read_events(server.run_dir / "adapter.log") if e.get("event") == "request_resumed")
    return figures


def _count(figures: ChaosFigures, outcomes: list[Outcome], started: float) -> None:
    figures.sent = len(outcomes)
    for outcome in outcomes:
        setattr(figures, outcome.kind, getattr(figures, outcome.kind) + 1)
        if outcome.kind == "errored":
            figures.errors[outcome.detail] = figures.errors.get(outcome.detail, 0) + 1
    figures.longest_request_s = round(max((o.seconds for o in outcomes), default=0.0), 2)
    figures.longest_pause_s = max((o.longest_pause_s for o in outcomes if o.kind == "completed"), default=0.0)
    figures.distinct_texts = len({o.text for o in outcomes if o.kind == "completed"})
    kills = [started + r.at_s for r in figures.restarts] + [started + figures.duration_s]
    for restart, next_kill in zip(figures.restarts, kills[1:]):  # requests started between back and the next kill
        back = started + restart.at_s + (restart.serving_again_s or 0.0)
        figures.completed_after_each_restart.append(
            sum(1 for o in outcomes if o.kind == "completed" and back <= o.started < next_kill))
    for restart, next_kill in zip(figures.restarts, [*kills[1:-1], float("inf")]):  # pauses that span this kill
        killed_at = started + restart.at_s
        paused = sorted(o.longest_pause_s for o in outcomes
                        if o.kind == "completed" and killed_at <= o.longest_pause_end < next_kill
                        and o.longest_pause_end - o.longest_pause_s <= killed_at + 0.05)
        figures.pauses.append({"stage": restart.stage, "streams": len(paused),
                               "p50_s": paused[len(paused) // 2] if paused else None,
                               "max_s": paused[-1] if paused else None})
