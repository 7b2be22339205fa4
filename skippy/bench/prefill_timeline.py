"""`skippy bench prefill --timeline`: where each prefill chunk's time goes, at stage 0 and at every stage.

Every batch comes back to stage 0 with each stage's `StageTiming` (when its compute began, its compute ms,
the credit wait before it was handed on, when it was handed on); at `--telemetry-level debug` stage 0 logs
them per batch (`iteration_done`, skippy.driver.telemetry). Clocks are one machine's wall clock, so
differences across processes are meaningful. A chunk's `rows` are its prompt rows (+ the decode rows of other
sessions that rode in the same batch); `start` is when stage 0 began it, after the request was sent. Per chunk and
stage: `idle` is the time the stage computed
nothing since its previous chunk (at stage 0 on one host: the Python work between chunks, scheduling and
post-processing; at a later stage: waiting for the chunk to arrive), `compute` its runtime call (llama_decode
over the rows, and the final stage's sampling), `out` from compute end to the hand-off (a credit wait, the
encode and send); `hop` is from the previous stage's hand-off to this stage's compute start (the wire, the
receive, and any queueing behind the chunk before).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ChunkTiming", "read_chunks", "timeline_table"]


@dataclass(frozen=True)
class StageSpan:
    stage_id: str
    start: float  # wall clock
    compute_ms: float
    wait_ms: float
    sent_at: float

    @property
    def end(self) -> float:
        return self.start + self.compute_ms / 1e3


@dataclass(frozen=True)
class ChunkTiming:
    rows: int
    prefill_rows: int
    stages: tuple[StageSpan, ...]


def read_chunks(run_dir: Path, start: float, end: float) -> list[ChunkTiming]:
    """The prefill batches stage 0 logged (`iteration_done` with timings) that began within [start, end]."""
    chunks = []
    for log in sorted(run_dir.glob("*.log")):
        with log.open(errors="replace") as lines:
            for line in lines:
                if '"iteration_done"' not in line:
                    continue
                event = json.loads(line)
                spans = tuple(StageSpan(*t) for t in event.get("timings") or ())
                if event.get("prefill_rows") and spans and start <= spans[0].start <= end:
                    chunks.append(ChunkTiming(int(event["rows"]), int(event["prefill_rows"]), spans))
    return sorted(chunks, key=lambda c: c.stages[0].start)


def timeline_table(chunks: list[ChunkTiming], sent_at: float, first_at: float) -> str:
    """One line per chunk: its rows, its start after the request was sent, and per stage idle / hop, compute, out
    (ms); then each stage's totals and the request's time before the first chunk and after the last."""
    if not chunks:
        return "no prefill batches logged (run skippy at --telemetry-level debug)"
    n_stages = len(chunks[0].stages)
    head = "chunk    rows  start s" + "".join(f" | {span.stage_id:>8}: idle/hop compute   out" for span in chunks[0].stages)
    lines = [head]
    previous: list[StageSpan | None] = [None] * n_stages
    idle = [0.0] * n_stages
    for k, chunk in enumerate(chunks):
        rows = f"{chunk.prefill_rows}" + (f"+{chunk.rows - chunk.prefill_rows}" if chunk.rows > chunk.prefill_rows else "")
        cells = f"{k:>5} {rows:>7} {chunk.stages[0].start - sent_at:>8.2f}"
        for i, span in enumerate(chunk.stages):
            before = previous[i]
            gap = (span.start - before.end) * 1e3 if before is not None else 0.0
            idle[i] += max(gap, 0.0)
            hop = (span.start - chunk.stages[i - 1].sent_at) * 1e3 if i else None
            out = (span.sent_at - span.end) * 1e3
            first = f"{gap:.0f}" + (f"/{hop:.0f}" if hop is not None else "")
            cells += f" | {first:>18} {span.compute_ms:>7.0f} {out:>5.0f}"
            previous[i] = span
        lines.append(cells)
    first_start, last = chunks[0].stages[0].start, chunks[-1].stages[-1]
    lines.append(f"request sent -> first chunk's compute: {(first_start - sent_at) * 1e3:.0f} ms; last chunk's hand-off"
                 f" -> first token at the client: {(first_at - last.sent_at) * 1e3:.0f} ms; TTFT {first_at - sent_at:.2f} s")
    for i in range(n_stages):
        spans = [c.stages[i] for c in chunks]
        busy = sum(s.compute_ms for s in spans) / 1e3
        wall = spans[-1].end - spans[0].start
        lines.append(f"{spans[0].stage_id}: {len(spans)} chunks, compute {busy:.2f} s, idle between chunks"
                     f" {idle[i] / 1e3:.2f} s, busy {busy / wall:.0%} of its {wall:.2f} s from first to last chunk")
    return "\n".join(lines)
