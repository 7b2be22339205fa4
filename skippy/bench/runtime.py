"""`skippy bench runtime`: the 2-slice chain against the unsplit llama.cpp model, side by side in one run.

Prefill (a 128-token prompt, fresh session each time) and single-stream greedy decode are timed in
alternating rounds for both so machine noise hits both alike; the table reports medians and ratios.
Peak RSS per slice is measured in a child process per slice that runs the same work alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from skippy.runtime.chain import LocalChain, layer_ranges
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.models import BENCH_MODEL, BENCH_MODEL_HELP, resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow


def _prefill_rate(chain: LocalChain, prompt: np.ndarray) -> float:
    start = time.perf_counter()
    chain.decode([SessionWindow(0, 0, len(prompt), (len(prompt) - 1,), prompt)])
    elapsed = time.perf_counter() - start
    chain.release(0)
    return len(prompt) / elapsed


def _decode_rate(chain: LocalChain, prompt: np.ndarray, n_tokens: int) -> float:
    rows = chain.decode([SessionWindow(0, 0, len(prompt), (len(prompt) - 1,), prompt)])
    pos = len(prompt)
    start = time.perf_counter()
    for _ in range(n_tokens):
        token = chain.final.sample(0, rows[0][0])
        rows = chain.decode([SessionWindow(0, pos, 1, (0,), np.array([token], np.int32))])
        pos += 1
    elapsed = time.perf_counter() - start
    chain.release(0)
    return n_tokens / elapsed


def _slice_rss(model: str, start: int, end: int, prompt_len: int, decode_tokens: int) -> dict[str, float]:
    """Run one slice alone in a child process; returns its peak RSS and budget in MiB."""
    code = (
        "import sys, json; from skippy.bench.runtime import slice_worker; "
        "print(json.dumps(slice_worker(sys.argv[1], *map(int, sys.argv[2:]))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, model, str(start), str(end), str(prompt_len), str(decode_tokens)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def slice_worker(model: str, start: int, end: int, prompt_len: int, decode_tokens: int) -> dict[str, float]:
    spec = RuntimeSpec(model_path=model, layer_start=start, layer_end=end, lane_count=1)
    stage = StageRuntime(spec)
    rng = np.random.default_rng(0)
    def inputs(n: int) -> dict[str, object]:
        if stage.is_first:
            return {"tokens": rng.integers(10, 1000, n).astype(np.int32)}
        return {}
    hidden = None if stage.is_first else rng.standard_normal((prompt_len, stage.n_embd)).astype(np.float32)
    out = (prompt_len - 1,) if stage.is_final else ()
    stage.decode([SessionWindow(0, 0, prompt_len, out, **inputs(prompt_len))], hidden)  # type: ignore[arg-type]
    for i in range(decode_tokens):
        h = None if stage.is_first else rng.standard_normal((1, stage.n_embd)).astype(np.float32)
        stage.decode([SessionWindow(0, prompt_len + i, 1, (0,) if stage.is_final else (), **inputs(1))], h)  # type: ignore[arg-type]
    path = stage.model.path
    gguf = GGUFFile(path)
    tensor_bytes = sum(t.nbytes for t in gguf.tensors)
    arch = gguf.get("general.architecture")
    n_layer, head_kv = _meta_int(gguf, f"{arch}.block_count"), _meta_int(gguf, f"{arch}.attention.head_count_kv")
    k_len = _meta_int(gguf, f"{arch}.attention.key_length", stage.n_embd)
    v_len = _meta_int(gguf, f"{arch}.attention.value_length", stage.n_embd)
    gguf.close()
    kv_bytes = n_layer * stage.params.n_ctx * head_kv * (k_len + v_len) * 2  # f16 K and V
    stage.close()
    mib = 1 << 20
    rss = peak_rss_bytes() / mib
    return {"rss_mib": rss, "tensor_mib": tensor_bytes / mib, "kv_mib": kv_bytes / mib,
            "budget_mib": tensor_bytes / mib + kv_bytes / mib + 200}


def _meta_int(gguf: GGUFFile, key: str, default: int | None = None) -> int:
    value = gguf.get(key, default)
    if not isinstance(value, int):
        raise ValueError(f"{gguf.path}: {key} is {value!r}, not an integer")
    return value


def peak_rss_bytes() -> int:
    """VmHWM of this process (ru_maxrss would include the parent's peak, inherited across fork+exec)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _median_pair(rounds: int, a: Callable[[], float], b: Callable[[], float]) -> tuple[float, float]:
    xs, ys = [], []
    for _ in range(rounds):
        xs.append(a())
        ys.append(b())
    return statistics.median(xs), statistics.median(ys)


def run_runtime_bench(model: str, split: int, rounds: int, prompt_len: int, decode_tokens: int) -> int:
    path = resolve_model_path(model)
    n_layer = read_model_info(path).n_layer
    spec = RuntimeSpec(model_path=path, layer_start=0, layer_end=0, lane_count=1)
    unsplit, chain = LocalChain(spec), LocalChain(spec, [split])
    prompt = np.random.default_rng(1).integers(10, 1000, prompt_len).astype(np.int32)
    try:
        _decode_rate(unsplit, prompt, 4), _decode_rate(chain, prompt, 4)  # warm up both
        pre_u, pre_c = _median_pair(rounds, lambda: _prefill_rate(unsplit, prompt), lambda: _prefill_rate(chain, prompt))
        dec_u, dec_c = _median_pair(
            rounds, lambda: _decode_rate(unsplit, prompt, decode_tokens), lambda: _decode_rate(chain, prompt, decode_tokens)
        )
    finally:
        unsplit.close()
        chain.close()
    print(f"model {path.name}, {n_layer} layers, split at {split}, {rounds} alternating rounds (medians)")
    print(f"{'':<22}{'unsplit':>12}{'2-slice chain':>16}{'ratio':>9}{'target':>9}")
    print(f"{'prefill tok/s (' + str(prompt_len) + ')':<22}{pre_u:>12.1f}{pre_c:>16.1f}{pre_c / pre_u:>9.3f}{'>= 0.95':>9}")
    print(f"{'decode tok/s':<22}{dec_u:>12.1f}{dec_c:>16.1f}{dec_c / dec_u:>9.3f}{'>= 0.95':>9}")
    print(f"\n{'slice':<10}{'peak RSS MiB':>14}{'tensors MiB':>13}{'KV MiB':>9}{'budget MiB':>12}{'within':>8}")
    for start, end in layer_ranges(n_layer, [split]):
        r = _slice_rss(str(path), start, end, prompt_len, decode_tokens)
        ok = "yes" if r["rss_mib"] <= r["budget_mib"] else "NO"
        print(f"{f'[{start},{end})':<10}{r['rss_mib']:>14.1f}{r['tensor_mib']:>13.1f}{r['kv_mib']:>9.1f}{r['budget_mib']:>12.1f}{ok:>8}")
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    r = kinds.add_parser("runtime", help="2-slice chain vs unsplit llama.cpp: prefill, decode, RSS per slice")
    r.add_argument("--model", default=BENCH_MODEL, help=BENCH_MODEL_HELP)
    r.add_argument("--split", type=int, default=9)
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--prompt-tokens", type=int, default=128)
    r.add_argument("--decode-tokens", type=int, default=64)
    r.set_defaults(run=lambda a: run_runtime_bench(a.model, a.split, a.rounds, a.prompt_tokens, a.decode_tokens))
