"""`skippy bench speculative`, the serving-latency table in the field's vocabulary (vLLM's and llama.cpp's
bench names): per cell and mode, output tok/s (every output token ÷ the waves' wall time, submit to last
token), and mean / median / p99 of TTFT, TPOT, ITL and end-to-end latency, in ms."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Protocol

from skippy.bench.speculative_load import ModeResult

__all__ = ["latency_json", "latency_table", "spread"]

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


class LatencyCell(Protocol):
    workload: str
    delay_ms: float
    concurrency: int
    results: dict[str, ModeResult]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, median, p99) of `values` (nearest-rank p99; zeros when empty)."""
    if not values:
        return 0.0, 0.0, 0.0
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]
    return statistics.fmean(ordered), statistics.median(ordered), p99


def output_tok_s(result: ModeResult) -> float:
    return result.output_tokens / result.wall_s if result.wall_s > 0 else 0.0


def latency_table(cells: Sequence[LatencyCell]) -> str:
    """One markdown row per cell and mode: output tok/s, then mean/median/p99 ms of each latency."""
    head = ["workload", "ms/hop", "c", "mode", "output tok/s"] + [f"{m[:-3].upper()} mean/med/p99" for m in METRICS]
    rows = [head, ["---"] * 4 + ["---:"] * (len(head) - 4)]
    for cell in cells:
        for mode, result in cell.results.items():
            stats = ["/".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in spread(getattr(result, m))) for m in METRICS]
            rows.append([cell.workload, f"{cell.delay_ms:g}", str(cell.concurrency), mode,
                         f"{output_tok_s(result):.1f}", *stats])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def latency_json(result: ModeResult) -> dict[str, Any]:
    """The numbers behind one table row."""
    return {"output_tok_s": output_tok_s(result),
            **{m: dict(zip(("mean", "median", "p99"), spread(getattr(result, m)))) for m in METRICS}}
