"""Calibration: the cost table of one model on one CPU set, measured in a few seconds and cached.

`calibrated_costs(model, cpus)` returns the cached table for the model's digest, the CPU set and this
llama.cpp build, or measures it in a child process pinned to `cpus` (`python -m skippy.plan.calibrate`;
its llama.cpp threads follow the pinned CPUs, and this process is left as it was). The child loads
three slices with real llama.cpp: layers [0, L-1) (A) and [0, 1) (B), each without the head, and
[L-1, L) with it (C). Each decode has `rows` sessions of one row each at position POSITION (128), as
decode steps at that concurrency have (the final stage also samples each row, greedy, as plain decoding
does), and the KV holds as many sessions again (a serving stage's prefix-cache entries); medians of at
least 5, more until MIN_TIMED_S of decoding per row count is timed (so a burst of other work or a clock
change does not decide the table), after a warm-up. Then per layer = (A - B) / (L - 2), spread over the layers by their
weight bytes, the head = C - one layer, the embedding = B - one layer. A model's skeleton (its tensors zeros, what an
SSH host is sent to time it: skippy.runtime.slices) computes as fast as the model; its A is [0, 8) (L - 2 becomes 7),
so a host with memory for a stage can hold it. Cached as JSON under
`<cache dir>/plan/` (`$SKIPPY_CACHE_DIR` or ~/.cache/skippy), keyed by the model's digest, the CPU set, the
llama.cpp build and this machine (`machine_fingerprint`: CPU model and flags, and the boot): a cache dir
carried to another machine, or kept across a reboot onto other hardware, is measured again (seen: a table
from an earlier machine 1.4x too fast for the one serving, and every prediction off by as much).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from skippy.plan.costs import ROWS, ComputeCosts
from skippy.plan.memory import read_model_facts
from skippy.runtime.errors import ModelError
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.slices import file_digest, is_skeleton, slice_cache_dir

SKELETON_BODY_LAYERS = 8  # a skeleton is timed on its first layers: a host is measured within its memory

__all__ = ["calibrated_costs", "cost_cache_path", "machine_fingerprint", "measure_costs"]

# the context each timed row decodes at: a chat turn's (the benches' ~75-token prompt and half of 64-128
# generated tokens). Attention over it is a fifth of a SmolLM2 layer's decode cost at 8 rows (measured:
# at position 64 every prediction at c=16 was 15% too fast)
POSITION = 128
REPEATS = 5
METHOD = 2  # how the table is measured (part of the cache key): 2 = the KV holding prefix-cache-like sessions
MIN_TIMED_S = 0.3  # per row count: keep repeating until this much decoding is timed (REPEATS at least)


def machine_fingerprint() -> str:
    """What the cost table depends on beyond the model and the CPU set: the CPU model and flags, and the boot
    (a VM started again may land on other hardware under the same name)."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""
    cpu = sorted({line for line in read("/proc/cpuinfo").splitlines() if line.startswith(("model name", "flags"))})
    return hashlib.sha256("\n".join([*cpu, read("/proc/sys/kernel/random/boot_id").strip()]).encode()).hexdigest()[:16]


def cost_cache_path(model: Path, cpus: str) -> Path:
    build = metadata.version("llama-cpp-python")
    what = f"{file_digest(model)}:{cpus}:{build}:{ROWS}:{POSITION}:{METHOD}:{machine_fingerprint()}"
    key = hashlib.sha256(what.encode()).hexdigest()[:20]
    return slice_cache_dir().parent / "plan" / f"{model.stem[:40]}-cpus{cpus.replace(',', '_')}-{key}.json"


def calibrated_costs(model: Path, cpus: str = "all", *, refresh: bool = False, timeout_s: float = 600.0) -> ComputeCosts:
    """The cost table of `model` on CPU set `cpus` ("0-1", "2", or "all": unpinned), measured once."""
    path = cost_cache_path(model, cpus)
    if path.is_file() and not refresh:
        return ComputeCosts.load(path)
    print(f"skippy plan: calibrating {model.name} on CPUs {cpus} (a few seconds, cached in {path.parent})",
          file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "skippy.plan.calibrate", str(model), "--cpus", cpus, "--out", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"calibrating {model.name} on CPUs {cpus} failed: {tail}")
    return ComputeCosts.load(path)


def _timed(runtime: object, rows: int, first: bool, final: bool, n_embd: int) -> float:
    """Median ms of a decode of `rows` sessions x 1 row at POSITION (and greedy sampling on the final stage)."""
    from skippy.runtime.sampling import biased_argmax  # noqa: PLC0415  (llama.cpp loads in the child only)
    from skippy.runtime.windows import SessionWindow  # noqa: PLC0415

    n_vocab = runtime.n_vocab  # type: ignore[attr-defined]
    windows = [SessionWindow(s, POSITION, 1, (0,) if final else (),
                             np.array([(1000 + s) % n_vocab], np.int32) if first else None) for s in range(rows)]
    hidden = None if first else np.full((rows, n_embd), 0.01, np.float32)
    times: list[float] = []
    while len(times) < REPEATS + 1 or sum(times[1:]) < MIN_TIMED_S * 1e3:
        start = time.perf_counter()
        runtime.decode(windows, hidden)  # type: ignore[attr-defined]
        if final:
            for row in range(rows):
                biased_argmax(runtime.ctx.logits_row(row, n_vocab), {})  # type: ignore[attr-defined]
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


def _runtime_ms(model: Path, start: int, end: int, final: bool) -> list[float]:
    """ms at each of ROWS for a slice [start, end), its sessions first prefilled to POSITION."""
    from skippy.runtime.spec import RuntimeSpec  # noqa: PLC0415
    from skippy.runtime.stage_runtime import StageRuntime  # noqa: PLC0415
    from skippy.runtime.windows import SessionWindow  # noqa: PLC0415

    first = start == 0
    # twice the sessions timed: a serving stage's KV also holds prefix-cache entries about as long as its lanes'
    # sessions, and attention runs over every occupied cell (llama.cpp's n_kv; measured +10% at 8 rows)
    held = 2 * max(ROWS)
    runtime = StageRuntime(RuntimeSpec(model, start, end, ctx_size=POSITION + 8, lane_count=held))
    try:
        if final != runtime.is_final:
            raise ModelError(f"calibration slice [{start}, {end}) of {model.name}: final is {runtime.is_final}")
        for s in range(held):  # every session holds POSITION positions, as a running request does
            tokens = (np.arange(POSITION, dtype=np.int32) + 100) % runtime.n_vocab if first else None
            hidden = None if first else np.full((POSITION, runtime.n_embd), 0.01, np.float32)
            runtime.decode([SessionWindow(s, 0, POSITION, (), tokens)], hidden)
        return [_timed(runtime, rows, first, final, runtime.n_embd) for rows in ROWS]
    finally:
        runtime.close()


def measure_costs(model: Path, cpus: str = "all") -> ComputeCosts:
    """Measure the table here (call it in a process pinned to `cpus`)."""
    facts = read_model_facts(model)
    n = facts.n_layer
    if n < 3:
        raise ModelError(f"{model.name} has {n} layers; calibration needs at least 3")
    gguf = GGUFFile(model)
    try:
        skeleton = is_skeleton(gguf)
    finally:
        gguf.close()
    body_end = min(n - 1, SKELETON_BODY_LAYERS) if skeleton else n - 1
    body = _runtime_ms(model, 0, body_end, final=False)
    one = _runtime_ms(model, 0, 1, final=False)
    last = _runtime_ms(model, n - 1, n, final=True)
    per_layer = [max(0.0, (a - b) / (body_end - 1)) for a, b in zip(body, one)]
    mean_bytes = sum(facts.layer_bytes) / n
    layer_ms = tuple(tuple(p * facts.layer_bytes[i] / mean_bytes for p in per_layer) for i in range(n))
    return ComputeCosts(rows=ROWS, layer_ms=layer_ms, embed_ms=tuple(max(0.0, b - p) for b, p in zip(one, per_layer)),
                        head_ms=tuple(max(0.0, c - p) for c, p in zip(last, per_layer)), cpus=cpus, model=model.name)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skippy.plan.calibrate")
    p.add_argument("model", type=Path)
    p.add_argument("--cpus", default="all")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.cpus != "all":
        from skippy.config.cpu_sets import parse_cpu_list  # noqa: PLC0415
        from skippy.cpu_pinning import pin_process  # noqa: PLC0415

        pin_process(parse_cpu_list(args.cpus))
    costs = measure_costs(args.model, args.cpus)
    costs.save(args.out)
    print(json.dumps({"layer_ms_mean": [statistics.mean(v[i] for v in costs.layer_ms) for i in range(len(ROWS))],
                      "head_ms": costs.head_ms, "embed_ms": costs.embed_ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
