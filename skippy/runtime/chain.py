"""LocalChain: a model's stage runtimes run one after another in one process.

It is the single-process path of `skippy generate` and what the tests and benchmarks compare a split
against: with no split points it is simply the unsplit llama.cpp model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from skippy.runtime.errors import ModelError
from skippy.runtime.models import resolve_model_path
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.slices import Progress, read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow


def layer_ranges(n_layer: int, split_points: Sequence[int]) -> list[tuple[int, int]]:
    """`[5, 13]` over 18 layers -> [(0, 5), (5, 13), (13, 18)]; points must be increasing, inside (0, n_layer)."""
    points = list(split_points)
    if any(not 0 < p < n_layer for p in points) or points != sorted(set(points)):
        raise ModelError(
            f"split points {points} must be strictly increasing layer indices in 1..{n_layer - 1} "
            f"(the model has {n_layer} layers)"
        )
    edges = [0, *points, n_layer]
    return list(zip(edges[:-1], edges[1:]))


class LocalChain:
    def __init__(
        self, base: RuntimeSpec, split_points: Sequence[int] = (), progress: Progress | None = None
    ) -> None:
        path = resolve_model_path(base.model_path)
        n_layer = read_model_info(path).n_layer
        self.stages: list[StageRuntime] = []
        try:
            for start, end in layer_ranges(n_layer, split_points):
                spec = replace(base, model_path=path, layer_start=start, layer_end=end)
                self.stages.append(StageRuntime(spec, progress))
        except BaseException:
            self.close()
            raise
        self.final = self.stages[-1]

    def decode(self, windows: list[SessionWindow]) -> list[list[int]]:
        """Run the windows through every stage; returns the final stage's output rows per window."""
        hidden: np.ndarray | None = None
        for stage in self.stages:
            result = stage.decode(windows, hidden)
            if result.missed:  # every stage here saw the same operations: an entry cannot be missing
                raise RuntimeError(f"layers [{stage.layer_start}, {stage.layer_end}): no prefix cache entry to restore"
                                   f" for sessions {list(result.missed)}")
            hidden = result.hidden
        return result.output_rows

    def release(self, session_id: int) -> None:
        for stage in self.stages:
            stage.release_session(session_id)

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams | None = None,
        *,
        session_id: int = 0,
        stop_tokens: frozenset[int] = frozenset(),
        prefill_chunk: int | None = None,
    ) -> Iterator[int]:
        """Prefill the prompt (in chunks of at most n_batch) and yield sampled tokens until a stop token or max_tokens."""
        if not prompt:
            raise ModelError("empty prompt: at least one token is needed")
        self.final.configure_session(session_id, sampling or SamplingParams())
        chunk = prefill_chunk or self.final.params.n_batch
        try:
            tokens = np.asarray(prompt, np.int32)
            pos = 0
            while pos < len(tokens):
                n = min(chunk, len(tokens) - pos)
                last = pos + n == len(tokens)
                window = SessionWindow(session_id, pos, n, (n - 1,) if last else (), tokens[pos : pos + n])
                rows = self.decode([window])
                pos += n
            for _ in range(max_tokens):
                token = self.final.sample(session_id, rows[0][0])
                yield token
                if token in stop_tokens or pos >= self.final.spec.ctx_size:
                    return
                window = SessionWindow(session_id, pos, 1, (0,), np.array([token], np.int32))
                rows = self.decode([window])
                pos += 1
        finally:
            self.release(session_id)

    def close(self) -> None:
        for stage in self.stages:
            stage.close()
        self.stages.clear()
