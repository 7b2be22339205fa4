"""The floor under a pipeline's per-token overhead: the same split with no skippy code between the stages.

`python -m skippy.bench.floor MODEL SPLIT TOKENS` runs a bare 2-process llama.cpp pipeline: this
process computes layers [0, SPLIT) and sends the activations as raw bytes on a blocking pyzmq PUSH;
a child process computes the rest, takes the greedy token and sends it back with its compute time.
No protocol, no asyncio, no scheduling: what a token costs beyond the two computes here is ZeroMQ and
the least Python a hop can have, on caches llama.cpp has just swept. `skippy bench pipeline` prints
it next to the pipeline's overhead and the raw (warm) round trip. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from skippy.launcher import die_with_parent
from skippy.runtime.slices import read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow

_STOP = struct.pack("<ii", 0, 0)


def _sockets(ctx: zmq.Context[zmq.Socket[bytes]], here: str, there: str) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(here)
    push.connect(there)
    return pull, push


def serve_rest(model: str, split: int, here: str, back: str) -> None:
    """The child: layers [split, n_layer) and a greedy sample for every activation row that arrives."""
    runtime = StageRuntime(RuntimeSpec(model, split, read_model_info(Path(model)).n_layer, ctx_size=1024, lane_count=1))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pull, push = _sockets(ctx, here, back)
    try:
        while True:
            head, body = pull.recv_multipart()
            if head == _STOP:
                break
            start = time.perf_counter()
            pos, n = struct.unpack("<ii", head)
            runtime.decode([SessionWindow(0, pos, n, (n - 1,), None)], np.frombuffer(body, np.float32).reshape(n, -1))
            token = runtime.sample(0, n - 1)
            push.send(struct.pack("<id", token, (time.perf_counter() - start) * 1e3))
    finally:
        pull.close(0)
        push.close(1000)
        ctx.term()
        runtime.close()


def _await_answer(pull: zmq.Socket[bytes], child: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Wait for the child stage's answer; fail at once if it exited (its model did not load), or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not pull.poll(200):
        if child.poll() is not None:
            raise RuntimeError(f"bench floor: the child stage exited with {child.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench floor: the child stage did not answer within {timeout_s:g} s")


def measure(model: str, split: int, tokens: int, warm: int = 20) -> dict[str, float]:
    """Decode `tokens` greedy tokens after a 16-token prompt; medians of the decode steps after `warm`."""
    runtime = StageRuntime(RuntimeSpec(model, 0, split, ctx_size=1024, lane_count=1))
    with tempfile.TemporaryDirectory(prefix="skippy-floor-") as tmp:
        here, there = f"ipc://{Path(tmp) / 'a'}", f"ipc://{Path(tmp) / 'b'}"
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        pull, push = _sockets(ctx, here, there)
        child = subprocess.Popen([sys.executable, "-m", "skippy.bench.floor", "--serve", model, str(split), there, here],
                                 preexec_fn=die_with_parent)  # a child blocked on its PULL must not outlive us
        try:
            def step(pos: int, ids: np.ndarray) -> tuple[int, float, float, float]:
                start = time.perf_counter()
                hidden = runtime.decode([SessionWindow(0, pos, len(ids), tuple(range(len(ids))), ids)]).hidden
                compute0 = (time.perf_counter() - start) * 1e3
                push.send_multipart([struct.pack("<ii", pos, len(ids)), np.ascontiguousarray(hidden).data])
                _await_answer(pull, child)
                token, compute1 = struct.unpack("<id", pull.recv())
                return token, compute0, compute1, (time.perf_counter() - start) * 1e3

            prompt = np.random.default_rng(1).integers(1, min(5000, runtime.n_vocab), 16).astype(np.int32)
            token = step(0, prompt)[0]
            steps = []
            for pos in range(len(prompt), len(prompt) + tokens):
                token, *times = step(pos, np.array([token], np.int32))
                steps.append(times)
            steps = steps[warm:]
            push.send_multipart([_STOP, b""])
            child.wait(30)
        finally:
            if child.poll() is None:
                child.kill()
            pull.close(0)
            push.close(0)
            ctx.term()
            runtime.close()
    return {"overhead_ms": statistics.median(t - a - b for a, b, t in steps),
            "token_ms": statistics.median(t for _, _, t in steps),
            "compute_ms": statistics.median(a + b for a, b, _ in steps)}


async def floor_in_child(model: Path, split: int, tokens: int, timeout_s: float = 600.0) -> dict[str, float]:
    """`measure` in a process of its own (this one's event loop keeps serving its stages meanwhile)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "skippy.bench.floor", str(model), str(split),
                                                str(tokens), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                preexec_fn=die_with_parent)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"bench floor: no result within {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"bench floor exited with {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    result: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--serve"] and len(args) == 5:
        serve_rest(args[1], int(args[2]), args[3], args[4])
    elif len(args) == 3 and args[1].isdigit() and args[2].isdigit():
        print(json.dumps(measure(args[0], int(args[1]), int(args[2]))))
    else:
        raise SystemExit("usage: python -m skippy.bench.floor MODEL SPLIT TOKENS")
