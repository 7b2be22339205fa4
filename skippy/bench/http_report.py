"""`skippy bench http`, the report: each skippy variant and each peer server side by side per concurrency level
(tok/s and their ratio against the targets, TTFT and TPOT p50/p95, CPU ms per token, 429s), a plot of tok/s and TTFT
by concurrency, and bench-http.json with the run's facts, every level and the tables.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from skippy.bench.http_load import Results

__all__ = ["ABBREV", "OURS", "TARGETS", "cpu_by_role", "cpu_total", "pairs", "plot", "ratios", "table", "write_report"]

# skippy tok/s / peer tok/s, by peer and concurrency (llama-server on the same cores); a peer's
# speculative variant is held to its plain one's targets
TARGETS = {"llama-cpp-python": {1: 0.85, 8: 2.5}, "llama-server": {1: 0.9, 8: 0.85},
           "llama-server-spec": {1: 0.9, 8: 0.85}}
OURS = ("skippy", "skippy-spec")  # skippy up --no-speculative, and default skippy up (the speculation policy)
ABBREV = {"skippy": "sk", "skippy-spec": "sk+s", "llama-cpp-python": "ll", "llama-server": "ls", "llama-server-spec": "ls+s"}


def pairs(results: Results) -> list[tuple[str, str]]:
    """(skippy variant, peer) for every pair in `results`, skippy variants first."""
    ours = [n for n in OURS if n in results]
    return [(o, p) for o in ours for p in results if p not in OURS]


def ratios(results: Results, peer: str, ours: str = "skippy") -> dict[int, float]:
    """`ours` tok/s / `peer` tok/s by concurrency."""
    return {a["concurrency"]: a["tok_s"] / b["tok_s"] for a, b in zip(results[ours], results[peer])}


def table(results: Results, peer: str, ours: str = "skippy") -> str:
    """`ours` | `peer` side by side; p50/p95 pairs; ratio = ours tok/s / peer tok/s."""
    sk, pe = ABBREV[ours], ABBREV[peer]
    head = ("conc", f"tok/s {sk}", f"tok/s {pe}", "ratio", "target", f"TTFT ms {sk}", f"TTFT ms {pe}",
            f"TPOT ms {sk}", f"TPOT ms {pe}", f"CPU ms/tok {sk}/{pe}", f"429 {sk}/{pe}")
    rows = [head]
    for a, b in zip(results[ours], results[peer]):
        ratio, target = a["tok_s"] / b["tok_s"], TARGETS[peer].get(a["concurrency"])
        mark = "" if target is None else f">={target:g} " + ("ok" if ratio >= target else "NO")
        pair = lambda r, k, f: f"{r[k + '_p50_ms']:{f}}/{r[k + '_p95_ms']:{f}}"  # noqa: E731
        rows.append((str(a["concurrency"]), f"{a['tok_s']:.1f}", f"{b['tok_s']:.1f}", f"{ratio:.2f}", mark,
                     pair(a, "ttft", ".0f"), pair(b, "ttft", ".0f"), pair(a, "tpot", ".1f"), pair(b, "tpot", ".1f"),
                     f"{cpu_total(a)}/{cpu_total(b)}", f"{a['status_429']}/{b['status_429']}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("".join(f"{cell:>{w + 2}}" for cell, w in zip(row, widths)).rstrip() for row in rows)


def cpu_total(level: dict[str, Any]) -> str:
    """A level's CPU ms per token, all the server's processes together ("-" if not measured)."""
    total = level.get("cpu_ms_per_token", {}).get("total")
    return "-" if total is None else f"{total:.2f}"


def cpu_by_role(results: Results) -> str:
    """Every server's CPU ms per token by process role, per level: where each server's work goes."""
    lines = []
    for name, levels in results.items():
        for level in levels:
            shares = level.get("cpu_ms_per_token", {})
            parts = ", ".join(f"{r} {ms:.2f}" for r, ms in shares.items() if r != "total")
            lines.append(f"  {name:<17} c={level['concurrency']:<3} {cpu_total(level):>6} ms/token ({parts})")
    return "CPU ms per output token by process (user + system, /proc):\n" + "\n".join(lines)


def plot(results: Results, path: Path) -> None:
    import matplotlib  # noqa: PLC0415  (installed by skippy.bench.http.ensure_matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in results.items():
        cs = [r["concurrency"] for r in rows]
        left.plot(cs, [r["tok_s"] for r in rows], marker="o", label=name)
        right.plot(cs, [r["ttft_p50_ms"] for r in rows], marker="o", label=name)
    right.set_yscale("log")  # TTFT spans 10 ms to a minute (a serial server's queue)
    for ax, label in ((left, "aggregate output tok/s"), (right, "TTFT p50 (ms, log scale)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrent requests")
        if ax is left:
            ax.set_ylim(bottom=0)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"skippy up (2 stages) vs {' and '.join(n for n in results if n not in OURS)}, same GGUF, same cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(out: Path, results: Results, facts: dict[str, Any], text: str, max_tokens: int) -> None:
    """bench-http.json (``facts``, every level, the ratios against TARGETS, ``text``) and bench-http.png."""
    counts = {c for rows in results.values() for r in rows for c in r["token_counts"]}
    if counts != {max_tokens}:
        print(f"warning: tokens per request {sorted(counts)} != max_tokens {max_tokens}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    by_pair = {f"{ours} / {peer}": (peer, ratios(results, peer, ours)) for ours, peer in pairs(results)}
    (out / "bench-http.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), **facts, "results": results,
        "tok_s_ratio": {key: r for key, (_, r) in by_pair.items()},
        "targets": {key: {str(c): {"min_ratio": t, "ratio": r.get(c), "met": r.get(c, 0) >= t}
                          for c, t in TARGETS[peer].items()} for key, (peer, r) in by_pair.items()},
        "table": text}, indent=2) + "\n")
    plot(results, out / "bench-http.png")
    print(f"\nwrote {out / 'bench-http.json'} and {out / 'bench-http.png'}", file=sys.stderr)
