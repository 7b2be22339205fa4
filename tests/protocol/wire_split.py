"""A model split in two in this process, its boundary activations sent through the real codec.

`WireSplit(model, split)` holds the two slice runtimes; every decode passes stage 0's activations
through a `Send` — normally `wire(dtype)`: `encode` then `decode` in that dtype, as a stage's
downstream link does — before the final stage. With the same lanes, context and one thread it is
the reference a real 2-stage pipeline with `--activation-wire-dtype` must match token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from skippy.protocol import Batch, Window, WireDtype, decode, encode
from skippy.runtime.slices import read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow

Send = Callable[[np.ndarray], np.ndarray]


def wire(dtype: WireDtype, n_embd: int) -> Send:
    """Activations as the receiving stage gets them when sent in `dtype`."""
    def send(hidden: np.ndarray) -> np.ndarray:
        got = decode(encode(Batch(1, (Window(0, 0, hidden.shape[0]),), hidden, wire_dtype=dtype)), n_embd=n_embd)
        assert isinstance(got, Batch) and got.wire_dtype is dtype and got.hidden is not None
        return got.hidden
    return send


class WireSplit:
    """Slices [0, split) and [split, n_layer) of `model`, one thread each, session 0 only."""

    def __init__(self, model: Path, split: int, *, ctx_size: int = 256, lane_count: int = 1) -> None:
        n_layer = read_model_info(model).n_layer
        spec = RuntimeSpec(model_path=model, layer_start=0, layer_end=split, ctx_size=ctx_size, lane_count=lane_count,
                           n_threads=1)
        self.first = StageRuntime(spec)
        self.final = StageRuntime(RuntimeSpec(model_path=model, layer_start=split, layer_end=n_layer, ctx_size=ctx_size,
                                              lane_count=lane_count, n_threads=1))

    def wire(self, dtype: WireDtype) -> Send:
        return wire(dtype, self.first.n_embd)

    def logits(self, tokens: Sequence[int], pos: int, outputs: tuple[int, ...], send: Send) -> np.ndarray:
        """Logits [len(outputs), n_vocab] for `tokens` at `pos` (session 0), activations passed through `send`."""
        hidden = self.first.decode([SessionWindow(0, pos, len(tokens), outputs, np.asarray(tokens, np.int32))]).hidden
        assert hidden is not None
        rows = self.final.decode([SessionWindow(0, pos, len(tokens), outputs)], send(hidden)).output_rows[0]
        return np.stack([self.final.logits(row) for row in rows])

    def greedy(self, prompt: Sequence[int], n_new: int, send: Send) -> list[int]:
        """Greedy continuation: the prompt in one window, then one token per step (as the driver runs it)."""
        try:
            out = [int(np.argmax(self.logits(prompt, 0, (len(prompt) - 1,), send)[0]))]
            for i in range(n_new - 1):
                out.append(int(np.argmax(self.logits(out[-1:], len(prompt) + i, (0,), send)[0])))
            return out
        finally:
            self.release()

    def teacher_forced(self, prompt: Sequence[int], continuation: Sequence[int], send: Send) -> np.ndarray:
        """Logits of every continuation position, the prompt and continuation in one window."""
        tokens = [*prompt, *continuation[:-1]]
        try:
            return self.logits(tokens, 0, tuple(range(len(prompt) - 1, len(tokens))), send)
        finally:
            self.release()

    def release(self) -> None:
        self.first.release_session(0)
        self.final.release_session(0)

    def close(self) -> None:
        self.first.close()
        self.final.close()
