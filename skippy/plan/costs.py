"""The compute side of the cost model: ms per layer, for the input embedding and for the head, by batch rows.

`ComputeCosts` holds what calibration measured (skippy.plan.calibrate) on one CPU set: at 1, 4 and 16
rows, each layer's ms, the first stage's embedding gather and the final stage's head (output norm,
vocabulary projection and sampling). Between and beyond the measured rows it interpolates linearly
(the last segment's slope past 16); `chunk_ms` is a prompt chunk's cost. `scaled` gives a host that is `speed`
times as fast. `Overheads`
are the per-batch costs that are not llama.cpp's, measured once through a real pipeline
(docs/bench-pipeline.md's timeline): a forward hop's software cost, the return hop with stage 0's
postprocess and schedule, and a one-process step.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

__all__ = ["DEFAULT_OVERHEADS", "ROWS", "ComputeCosts", "Overheads", "interpolate"]

ROWS = (1, 4, 16)


def interpolate(rows: tuple[int, ...], values: tuple[float, ...], at: float) -> float:
    """Piecewise-linear through (rows[i], values[i]); linear past both ends."""
    if len(rows) == 1:
        return values[0] * at / rows[0]
    for i in range(1, len(rows)):
        if at <= rows[i] or i == len(rows) - 1:
            x0, x1, y0, y1 = rows[i - 1], rows[i], values[i - 1], values[i]
            return max(0.0, y0 + (y1 - y0) * (at - x0) / (x1 - x0))
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class ComputeCosts:
    """Measured ms of the parts of a forward pass on one CPU set, at `rows` batch rows."""

    rows: tuple[int, ...]
    layer_ms: tuple[tuple[float, ...], ...]  # [layer][i]: ms at rows[i]
    embed_ms: tuple[float, ...]  # the first stage's token embedding (and its input handling)
    head_ms: tuple[float, ...]  # the final stage's output norm, vocabulary projection and sampling
    cpus: str = "all"  # what it was measured on
    model: str = ""

    @property
    def n_layer(self) -> int:
        return len(self.layer_ms)

    def stage_ms(self, start: int, end: int, rows: float, outputs: float | None = None) -> float:
        """One decode of `rows` rows by a stage holding layers [start, end), `outputs` of them (default all)
        through the head."""
        total = self.chunk_ms(start, end, rows)
        if end == self.n_layer:
            total += interpolate(self.rows, self.head_ms, rows if outputs is None else outputs)
        return total

    def chunk_ms(self, start: int, end: int, rows: float) -> float:
        """`rows` rows through layers [start, end) and, at the first stage, the embedding; nothing through the head
        (a prompt chunk: the prompt needs the head for its last row alone)."""
        total = sum(interpolate(self.rows, self.layer_ms[i], rows) for i in range(start, end))
        return total + (interpolate(self.rows, self.embed_ms, rows) if start == 0 else 0.0)

    def scaled(self, speed: float) -> ComputeCosts:
        """The same costs on a host `speed` times as fast."""
        div = lambda values: tuple(v / speed for v in values)  # noqa: E731
        return replace(self, layer_ms=tuple(div(v) for v in self.layer_ms), embed_ms=div(self.embed_ms),
                       head_ms=div(self.head_ms))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ComputeCosts:
        data = json.loads(path.read_text())
        return cls(rows=tuple(data["rows"]), layer_ms=tuple(tuple(v) for v in data["layer_ms"]),
                   embed_ms=tuple(data["embed_ms"]), head_ms=tuple(data["head_ms"]), cpus=data.get("cpus", "all"),
                   model=data.get("model", ""))


@dataclass(frozen=True)
class Overheads:
    """Per-batch costs outside llama.cpp (ms), from docs/bench-pipeline.md's one-token timeline."""

    hop_ms: float = 0.8  # a forward hop: send, ZeroMQ both sides, decode, hand-off to the runtime thread
    return_ms: float = 1.2  # the predictions' return hop, stage 0's postprocess and next schedule
    step_ms: float = 0.6  # one stage alone: the step loop's postprocess and schedule around a decode
    stage_ms: float = 0.1  # each stage: compute end to the socket


DEFAULT_OVERHEADS = Overheads()
