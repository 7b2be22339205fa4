"""`--deterministic`: one llama.cpp context per lane, so a row's result never depends on its batch.

On the CPU a row's logits in one shared context depend on what else is in the KV cache and the batch
(docs/deterministic.md has the measurements and the llama.cpp lines): flash attention walks a session's
KV cells in cell order, and in a unified cache shared by many sessions a session's later cells can
land in front of its earlier ones (a hole left by another session); a decode whose last ubatch is one
row over 512 cells takes a KV-split kernel; 64 rows or more take a tiled one. Here every lane is its own
context holding one sequence, so its cells are its positions in order (trims are always of the tail);
each window is decoded alone in its lane's context, in ubatches of at most 32 rows (below the tiled
kernel); a window whose last ubatch would be one row over a KV of more than `SPLIT_KV_SAFE` cells gets
one throwaway row after it (causally invisible, trimmed right after). Logits stay in each lane's
context, so rows of all windows can be sampled after the batch.

The prefix cache runs unchanged on top (`KvSequences`, from `EntryStates`): an entry is the lane's sequence
state as bytes, restored into an emptied lane, where llama.cpp lays the cells out from cell 0 in position
order — the layout a prefill gives, with the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from skippy.runtime.capture import NativeCapture, PythonCapture
from skippy.runtime.entry_states import EntryStates
from skippy.runtime.llama_api import BatchBuffers, ContextParams, LlamaContext
from skippy.runtime.llama_model import LlamaModel
from skippy.runtime.windows import DecodeResult, SessionWindow

DETERMINISTIC_UBATCH = 32  # < 64 rows: llama.cpp's CPU flash attention tiles at 64 query rows (ops.cpp:9547)
SPLIT_KV_SAFE = 192  # llama.cpp pads n_kv to 256 cells; one query row over >= 512 of them splits the KV (ops.cpp:9490)


class LaneContexts(EntryStates):
    """One context per lane, each with one sequence (0); prefix cache entries are sequence-state bytes.

    Sequence ids follow the shared-context layout: lanes 0..lane_count-1, entries from lane_count."""

    def __init__(self, model: LlamaModel, params: ContextParams, lane_count: int, ctx_size: int,
                 capture: NativeCapture | PythonCapture | None) -> None:
        self.n_ubatch = min(params.n_ubatch, DETERMINISTIC_UBATCH)
        per_lane = replace(params, n_ctx=ctx_size + 1, n_seq_max=1, n_batch=params.n_batch + 1,
                           n_ubatch=self.n_ubatch, n_outputs_max=min(params.n_outputs_max, params.n_batch))
        hook = () if capture is None else (capture.callback, capture.user_data)
        self.capture = capture
        self.contexts = [LlamaContext(model, per_lane, *hook) for _ in range(lane_count)]
        super().__init__(lane_count, lambda lane: (self.contexts[lane], 0))
        self.n_vocab = model.n_vocab
        self._buffers = BatchBuffers(per_lane.n_batch, 1)
        self._outputs: dict[int, tuple[LlamaContext, int]] = {}  # batch row -> (its lane's context, output index)

    # -- decode ------------------------------------------------------------------------------------
    def decode(self, windows: Sequence[SessionWindow], hidden: np.ndarray | None, lane_of: Callable[[int], int],
               is_final: bool, n_embd: int) -> DecodeResult:
        """Each window in its lane's context (rows in window order); the hidden rows or output rows."""
        self._outputs.clear()
        hidden_out = None if is_final else np.empty((sum(w.n_tokens for w in windows), n_embd), np.float32)
        output_rows: list[list[int]] = []
        row = 0
        for w in windows:
            ctx = self.contexts[lane_of(w.session_id)]
            if ctx.seq_pos_max(0) >= w.pos_start:
                ctx.seq_rm(0, w.pos_start)  # positions are authoritative
            part = None if hidden is None else hidden[row:row + w.n_tokens]
            captured = self._decode_window(ctx, w, part, n_embd, is_final)
            if hidden_out is not None and captured is not None:
                hidden_out[row:row + w.n_tokens] = captured[:w.n_tokens]
            rows = [row + o for o in w.outputs] if is_final else []
            self._outputs.update({row + o: (ctx, o) for o in (w.outputs if is_final else ())})
            output_rows.append(rows)
            row += w.n_tokens
        return DecodeResult(hidden=hidden_out, output_rows=output_rows)

    def _decode_window(self, ctx: LlamaContext, w: SessionWindow, hidden: np.ndarray | None,
                       n_embd: int, is_final: bool) -> np.ndarray | None:
        pad = int(w.n_tokens % self.n_ubatch == 1 and w.pos_start + w.n_tokens > SPLIT_KV_SAFE)
        n = w.n_tokens + pad
        buf = self._buffers
        buf.pos[:n] = np.arange(w.pos_start, w.pos_start + n, dtype=np.int32)
        buf.logits[:n] = 0
        if is_final:  # a non-final stage keeps no logits (its context reserves one output row)
            buf.logits[list(w.outputs)] = 1
        embd = None
        if w.tokens is not None:
            buf.token[:w.n_tokens] = w.tokens
            buf.token[w.n_tokens:n] = w.tokens[-1]
        if hidden is not None:
            embd = np.ascontiguousarray(hidden, np.float32) if not pad else np.concatenate([hidden, hidden[-1:]])
        captured = None
        if self.capture is not None:
            captured = np.empty((n, n_embd), np.float32)
            self.capture.arm(captured)
        ctx.decode(buf.build(n, np.zeros(n, np.int32), embd=embd))
        if self.capture is not None and self.capture.floats() != n * n_embd:
            raise RuntimeError(f"captured {self.capture.floats()} floats of layer output, expected {n * n_embd}")
        if pad:
            ctx.seq_rm(0, w.pos_start + w.n_tokens)
        return captured

    def output(self, batch_row: int) -> tuple[LlamaContext, int]:
        """The context holding an output row of the last decode and the row's index in its own batch."""
        found = self._outputs.get(batch_row)
        if found is None:
            raise RuntimeError(f"no logits for batch row {batch_row}")
        return found

    def close(self) -> None:
        for ctx in self.contexts:
            ctx.close()
        self.clear_entries()
