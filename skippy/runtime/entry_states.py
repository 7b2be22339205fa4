"""Prefix cache entries kept outside the KV cache, as llama.cpp sequence-state bytes.

In a unified KV cache every cell up to the highest one in use is part of every decode's attention: llama.cpp
pads `n_kv` to the highest used cell and its CPU flash attention reads the mask of each of those cells for every
query row, head and layer, masked or not. Entries kept as cells of their own would make every other session's
prefill pay for them (measured: +26% CPU for a 2,048-token prompt beside 8,192 kept cells). So an entry is the
lane's sequence state copied out (`llama_state_seq_get_data`) when it is recorded, and copied back into the
emptied lane (`llama_state_seq_set_data`) when it is restored; the KV pool holds the lanes' cells only.

`EntryStates` is the prefix cache's `KvSequences` over lanes that live in llama.cpp contexts: sequences below
`lane_count` are lanes, the ones from `lane_count` on are entries. A record copies the lane's positions [0, n)
(the lane holds exactly those when a window or a release records it); a restore empties the lane, writes the
entry into it and trims it to the positions asked for.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import llama_cpp as L
import numpy as np

from skippy.runtime.llama_api import LlamaContext

_BYTES = ctypes.POINTER(ctypes.c_uint8)


class EntryStates:
    def __init__(self, lane_count: int, lane_context: Callable[[int], tuple[LlamaContext, int]]) -> None:
        self.lane_count = lane_count
        self._lane_context = lane_context  # lane -> (the context holding it, its sequence id there)
        self._entries: dict[int, tuple[np.ndarray, int]] = {}  # entry sequence -> (state bytes, positions kept)

    # -- KvSequences ---------------------------------------------------------------------------------
    def seq_pos_max(self, seq: int) -> int:
        if seq < self.lane_count:
            ctx, lane_seq = self._lane_context(seq)
            return ctx.seq_pos_max(lane_seq)
        entry = self._entries.get(seq)
        return -1 if entry is None else entry[1] - 1

    def seq_rm(self, seq: int, p0: int) -> None:
        if seq < self.lane_count:
            ctx, lane_seq = self._lane_context(seq)
            ctx.seq_rm(lane_seq, p0)
        elif p0 <= 0:
            self._entries.pop(seq, None)
        elif seq in self._entries:
            data, n = self._entries[seq]
            self._entries[seq] = (data, min(n, p0))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Record (lane -> entry) or restore (entry -> an emptied lane) positions [0, p1)."""
        if p0 != 0 or (src < self.lane_count) == (dst < self.lane_count):
            raise RuntimeError(f"prefix entries: copy {src} -> {dst} [{p0}, {p1}) is not a record or a restore")
        if src < self.lane_count:
            self._entries[dst] = (self._read(*self._lane_context(src)), p1)
            return
        data, n = self._entries[src]
        ctx, lane_seq = self._lane_context(dst)
        # llama.cpp empties the lane first (state_read_meta: seq_rm of the destination)
        if L.llama_state_seq_set_data(ctx.ptr, data.ctypes.data_as(_BYTES), data.nbytes, lane_seq) == 0:
            raise RuntimeError(f"llama.cpp refused to restore prefix entry {src} into lane {dst}")
        if min(n, p1) <= ctx.seq_pos_max(lane_seq):
            ctx.seq_rm(lane_seq, min(n, p1))

    @staticmethod
    def _read(ctx: LlamaContext, seq: int) -> np.ndarray:
        size = L.llama_state_seq_get_size(ctx.ptr, seq)
        data = np.empty(size, np.uint8)
        written = L.llama_state_seq_get_data(ctx.ptr, data.ctypes.data_as(_BYTES), size, seq)
        return data if written == size else data[:written].copy()

    def clear_entries(self) -> None:
        self._entries.clear()
