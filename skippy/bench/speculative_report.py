"""`skippy bench speculative`, the report: one table row per cell (plain vs each speculative mode: decode
tok/s and ratio, TTFT, acceptance, mean accepted drafts per window, requests whose output differs from
plain), the targets (`TARGETS`) as met / not met, and docs/bench-speculative.{md,json,png}.

The generated markdown keeps whatever follows NOTES_MARKER in the existing file (hand-written reading
of the numbers), so a re-run replaces the numbers and leaves the notes for a person to revisit.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skippy.bench.speculative_latency import latency_json, latency_table
from skippy.bench.speculative_load import ModeResult

__all__ = ["NOTES_MARKER", "TTFT_TOLERANCE", "Cell", "table", "targets", "write_report"]

NOTES_MARKER = "<!-- notes: kept across runs -->"
TTFT_TOLERANCE = 1.10  # "TTFT unchanged": speculative TTFT, pooled over every request, within 10% of plain
THIN_MARGIN = 0.5  # speculative output may differ from plain only where the top-2 logit margin is below this


@dataclass
class Cell:
    workload: str
    delay_ms: float
    concurrency: int
    n: int  # requests per mode
    results: dict[str, ModeResult]  # mode -> result; the first mode is plain
    prompts: list[list[int]]  # in the order of each mode's outputs
    margins: dict[str, list[float]] = field(default_factory=dict)  # mode -> top-2 margin at each mismatch
    load: float = 0.0  # the machine's 1-minute load average when the cell ended (this run's processes included)
    peers: tuple[str, ...] = ()  # modes that are llama-servers (skippy.bench.speculative_peers), not skippy's driver
    served_factor: float = 1.0  # the policy's cost model at the cell's end: served batches' ms over calibration's

    @property
    def plain(self) -> ModeResult:
        return next(iter(self.results.values()))

    def speculative(self) -> dict[str, ModeResult]:
        """skippy's speculative modes (every mode after plain that is not a peer)."""
        return {m: r for m, r in list(self.results.items())[1:] if m not in self.peers}

    def ratio(self, mode: str) -> float:
        return self.results[mode].tok_s / self.plain.tok_s if self.plain.tok_s else 0.0

    def mismatched(self, mode: str) -> list[int]:
        """Indices of the requests whose output under `mode` differs from plain's."""
        return [i for i, (a, b) in enumerate(zip(self.results[mode].outputs, self.plain.outputs)) if a != b]

    def mismatches(self, mode: str) -> int:
        return len(self.mismatched(mode))

    def wide(self, mode: str) -> int:
        """Mismatches whose first differing token had a top-2 margin of at least THIN_MARGIN (unexpected)."""
        return sum(m >= THIN_MARGIN for m in self.margins.get(mode, []))

    def line(self) -> str:
        ratios = ", ".join(f"{m} {self.ratio(m):.2f}x" for m in list(self.results)[1:])
        return (f"bench: {self.workload} {self.delay_ms:g} ms/hop c={self.concurrency} n={self.n}: "
                f"plain {self.plain.tok_s:.1f} tok/s; {ratios}; served batches {self.served_factor:.2f}x calibration")


def _accept(r: ModeResult) -> str:
    t = r.totals
    return f"{t.accepted / t.proposed:.2f}" if t.proposed else "-"


def _per_window(r: ModeResult) -> str:
    t = r.totals
    return f"{t.accepted / t.windows:.1f}" if t.windows else "-"


def peer_names(cells: list[Cell]) -> list[str]:
    return list(dict.fromkeys(p for c in cells for p in c.peers))


def table(cells: list[Cell]) -> str:
    """A markdown table; per speculative mode: tok/s, ratio, TTFT, acceptance, accepted/window, mismatches;
    per peer (llama-server, 0 ms cells only): tok/s and its ratio to skippy's plain decoding."""
    modes, peers = list(cells[0].speculative()), peer_names(cells)
    head = ["workload", "ms/hop", "c", "n", "load", "plain tok/s", "plain TTFT ms"]
    for m in modes:
        head += [f"{m} tok/s", "ratio", "TTFT ms", "accept", "acc/win", "≠ plain (wide)"]
    for m in peers:
        head += [f"{m} tok/s", "÷ plain"]
    rows = [head, ["---"] * 5 + ["---:"] * (len(head) - 5)]
    for cell in cells:
        row = [cell.workload, f"{cell.delay_ms:g}", str(cell.concurrency), str(cell.n), f"{cell.load:.1f}",
               f"{cell.plain.tok_s:.1f}",
               f"{cell.plain.mean_ttft_ms:.0f}"]
        for m, r in cell.speculative().items():
            row += [f"{r.tok_s:.1f}", f"**{cell.ratio(m):.2f}**", f"{r.mean_ttft_ms:.0f}", _accept(r), _per_window(r),
                    f"{cell.mismatches(m)} ({cell.wide(m)})"]
        for m in peers:
            row += [f"{cell.results[m].tok_s:.1f}", f"{cell.ratio(m):.2f}"] if m in cell.results else ["-", "-"]
        rows.append(row)
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


AGENT_CODE = ("re-emission", "sub-tasks")
TARGETS: list[tuple[str, Callable[[Cell], bool], float]] = [  # the least ratio to plain each group of cells must reach
    ("agent/code work (re-emission, sub-tasks), c=1", lambda c: c.workload in AGENT_CODE and c.concurrency == 1, 2.0),
    ("agent/code work (re-emission, sub-tasks), c=8", lambda c: c.workload in AGENT_CODE and c.concurrency == 8, 1.15),
    ("prose, c=1", lambda c: c.workload == "prose" and c.concurrency == 1, 0.97),
    ("never slower (every cell)", lambda c: True, 0.97),
]


def targets(cells: list[Cell]) -> list[dict[str, Any]]:
    """Per target and speculative mode: the worst ratio over the cells it covers, and whether it is met."""
    modes = list(cells[0].speculative())
    out: list[dict[str, Any]] = []
    for name, covers, minimum in TARGETS:
        chosen = [c for c in cells if covers(c)]
        if not chosen:
            continue
        worst = {m: min(c.ratio(m) for c in chosen) for m in modes}
        out.append({"target": name, "min_ratio": minimum, "worst": worst,
                    "met": {m: worst[m] >= minimum for m in modes}})
    plain_ttft = sum(sum(c.plain.ttft_ms) for c in cells)
    ttft = {m: sum(sum(c.results[m].ttft_ms) for c in cells) / plain_ttft for m in modes}
    out.append({"target": "TTFT unchanged (mean over every request of the run)", "max_ratio": TTFT_TOLERANCE,
                "worst": ttft, "met": {m: ttft[m] <= TTFT_TOLERANCE for m in modes}})
    return out


def _targets_md(rows: list[dict[str, Any]]) -> str:
    lines = ["| target | bound | " + " | ".join(rows[0]["worst"]) + " |", "|---|---|" + "---|" * len(rows[0]["worst"])]
    for t in rows:
        bound = f"≥ {t['min_ratio']}×" if "min_ratio" in t else f"≤ {t['max_ratio']}×"
        cells = [f"{t['worst'][m]:.2f}× {'met' if t['met'][m] else '**not met**'}" for m in t["worst"]]
        lines.append(f"| {t['target']} | {bound} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    return f"{name}, {len(os.sched_getaffinity(0))} CPUs"


def plot(cells: list[Cell], path: Path, split: int = 9) -> None:
    import matplotlib  # noqa: PLC0415  (installed by skippy.bench.http.ensure_matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    workloads = list(dict.fromkeys(c.workload for c in cells))
    modes = list(cells[0].speculative())
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), sharey=True, squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        chosen = [c for c in cells if c.workload == workload]
        width = 0.8 / len(modes)
        for i, m in enumerate(modes):
            xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(chosen))]
            bars = ax.bar(xs, [c.ratio(m) for c in chosen], width, label=m)
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        for j, cell in enumerate(chosen):  # each target over the cells it covers
            for minimum in (m for _, covers, m in TARGETS if covers(cell)):
                ax.hlines(minimum, j - 0.45, j + 0.45, colors="black", linestyles=":", linewidth=1.2)
        ax.set_xticks(range(len(chosen)), [f"{c.delay_ms:g} ms\nc={c.concurrency}" for c in chosen])
        ax.set_title(f"{workload} (dotted: targets)")
        ax.set_ylabel("decode tok/s, speculative ÷ plain")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"suffix-proposer speculative decoding vs plain, {_shape(split)}, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _shape(split: int) -> str:
    return "2 stages" if split else "one stage"


def _where(split: int) -> str:
    if not split:
        return "whole in one stage (as plain `skippy up` serves one host), its driver in the bench's process"
    return f"split at layer {split}: stage 1 a real process, stage 0's driver in the bench's process"


def _peers_md(cells: list[Cell], facts: dict[str, Any]) -> str:
    peers = peer_names(cells)
    if not peers:
        return ""
    differ = ", ".join(f"{p} {sum(c.mismatches(p) for c in cells if p in c.results)} of "
                       f"{sum(c.n for c in cells if p in c.results)}" for p in peers)
    return (f"Peers, in the 0 ms cells (one process, no hop), on the same token prompts through `/completion`, greedy,"
            f" no prompt cache: {facts.get('peers', '')}; \"÷ plain\" = the peer's tok/s ÷ skippy plain's in the same cell."
            f" Their greedy output differs from skippy plain's in: {differ} requests.\n")


def _format_md(name: str) -> str:
    return ("chat messages in the model's own template (an instruct model; skippy.bench.speculative_workloads)"
            if name == "chat" else "completion text (a base model; skippy.bench.speculative_workloads)")


def _markdown(cells: list[Cell], facts: dict[str, Any], goals: list[dict[str, Any]], notes: str) -> str:
    mism = {m: (sum(c.mismatches(m) for c in cells), sum(c.wide(m) for c in cells)) for m in cells[0].speculative()}
    total = sum(c.n for c in cells)
    return f"""# `skippy bench speculative`: plain vs speculative decoding, {_shape(facts['split'])}

Measured {facts['date']} on {facts['machine']} with:

    {facts['command']}

(= `.venv/bin/skippy bench speculative`; every number also in `docs/bench-speculative.json`, ratios
plotted in `docs/bench-speculative.png`.) Model {facts['model']} {_where(facts['split'])}; prompts as
{_format_md(facts.get('prompt_format', 'completion'))}; greedy, max_tokens
{facts['max_tokens']}, stopping at end-of-generation tokens. plain = `--no-speculative`; policy = the default
of `skippy up` (the suffix proposer, min n-gram 3, max 16, at most 16 drafts, with the cross-request index
emptied before each cell, under the per-session policy: k <= 16 alone, <= 8 among several sessions, pipeline depth <= 2, the draft
rows of each batch given to the sessions whose drafts pay). Calibrated C(rows) (rows: ms):
{facts['calibrated_cost_ms']}; served batches' ms over it at each cell's end (attention over every
session's KV, other work on the host): {[round(c.served_factor, 2) for c in cells]}.
{_peers_md(cells, facts)}Load average (1 min) at the start and the end of the run: {facts['load_avg_1min']} (other work shares the
machine; the modes alternate round by round so it hits them alike).

![ratios](bench-speculative.png)

{table(cells)}

Columns: ms/hop = wire delay on each hop (stage 0 → stage 1 and the return); c = requests in flight; load =
the machine's 1-minute load average as the cell ended (this bench's own processes included); n =
requests per mode (rounds of 2c at c in flight, each next request sent as one finishes;
each a different HumanEval problem or prose opening); tok/s = tokens after
each request's first ÷ the rounds' decode spans; ratio = speculative ÷ plain tok/s; TTFT = mean ms from
submit to the first token; accept = accepted ÷ proposed drafts; acc/win = accepted drafts per verify
window (tokens per window = acc/win + 1); ≠ plain = requests whose greedy output differs from plain's, and
(wide) how many of them first differ at a token where the unsplit model's top-2 logit margin (after the
common prefix) is {THIN_MARGIN} or more, i.e. not explained by a thin margin.
Requests whose output differed from plain: {', '.join(f'{m} {k} of {total} ({w} wide)' for m, (k, w) in mism.items())}.

## Serving latency (ms; mean / median / p99)

{latency_table(cells)}

output tok/s = every output token ÷ the rounds' wall time (first submit to last token); TTFT = submit to
first token; TPOT = (last − first token) ÷ (tokens − 1) per request; ITL = every gap between two tokens of a
request (a verify window's tokens arrive together, so speculation makes many gaps ~0 and a few long);
E2E = submit to last token.

## Targets

{_targets_md(goals)}

{NOTES_MARKER}
{notes}"""


def write_report(out: Path, cells: list[Cell], facts: dict[str, Any]) -> str:
    """Write bench-speculative.{json,png,md} into `out`; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    facts = {**facts, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": cpu_model()}
    goals = targets(cells)
    (out / "bench-speculative.json").write_text(json.dumps({**facts, "targets": goals, "cells": [
        {"workload": c.workload, "delay_ms": c.delay_ms, "concurrency": c.concurrency, "n": c.n, "load": c.load,
         "served_factor": c.served_factor, "modes": {
            m: {"tok_s": r.tok_s, "ratio": c.ratio(m), "ttft_ms": r.ttft_ms, "decode_tokens": r.decode_tokens,
                "decode_s": r.decode_s, "totals": asdict(r.totals), "mismatched": c.mismatched(m),
                "margins": c.margins.get(m, []), **latency_json(r)}
            for m, r in c.results.items()}} for c in cells]}, indent=2) + "\n")
    plot(cells, out / "bench-speculative.png", facts["split"])
    md = out / "bench-speculative.md"
    old = md.read_text() if md.exists() else ""
    notes = old.split(NOTES_MARKER, 1)[1].lstrip("\n") if NOTES_MARKER in old else ""
    text = _markdown(cells, facts, goals, notes)
    md.write_text(text)
    return text
