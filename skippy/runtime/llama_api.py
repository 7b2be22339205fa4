"""Thin owners of llama.cpp objects (context, batch) over llama-cpp-python's low-level API.

Everything here is mechanical: load a GGUF, create a context, build a `llama_batch` that points
straight at numpy buffers (no per-row Python work), and turn llama.cpp's log lines into the reason
a load failed (`llama_backend` holds the process-wide part). The stage logic lives in `stage_runtime`.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np
from gguf import GGMLQuantizationType

from skippy.runtime.errors import ModelError
from skippy.runtime.llama_backend import clear_llama_log, last_llama_error
from skippy.runtime.llama_model import LlamaModel

_ggml = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libggml-base.so"))
_ggml.ggml_get_name.restype = ctypes.c_char_p
_ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
_ggml.ggml_nbytes.restype = ctypes.c_size_t
_ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
_ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
def tensor_name(tensor: int) -> bytes:
    return _ggml.ggml_get_name(tensor)


def copy_tensor(tensor: int, dest: np.ndarray) -> int:
    """Copy a computed tensor into the front of `dest` (float32); returns the number of floats."""
    nbytes = int(_ggml.ggml_nbytes(tensor))
    if nbytes > dest.nbytes:
        raise RuntimeError(f"captured tensor of {nbytes} bytes exceeds the {dest.nbytes}-byte buffer")
    _ggml.ggml_backend_tensor_get(tensor, dest.ctypes.data, 0, nbytes)
    return nbytes // 4


@dataclass(frozen=True)
class ContextParams:
    """The llama.cpp context shape; split and unsplit runs must use the same one to match bitwise."""

    n_ctx: int
    n_seq_max: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    n_outputs_max: int  # rows per decode whose logits are kept; sizes llama.cpp's output buffers
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn_type: str = "auto"
    offload_kqv: bool | None = None  # kv_offload: KV cache on the GPU with offloaded layers
    op_offload: bool | None = None  # offload host tensor ops to the GPU
    n_rs_seq: int = 0  # recurrent-state snapshots per sequence: a rewind of up to this many positions


_FLASH_ATTN = {
    "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "enabled": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "disabled": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)))


class LlamaContext:
    """An owned `llama_context *` with one KV sequence per lane (unified KV, full-size SWA cache).

    Unified KV keeps llama.cpp's ubatch split in batch order, so captured rows line up with input
    rows; full-size SWA cells let a session be trimmed back anywhere.
    """

    def __init__(self, model: LlamaModel, params: ContextParams, eval_callback: object | None = None,
                 eval_user_data: ctypes.c_void_p | None = None, *, ctx_type: int = L.LLAMA_CONTEXT_TYPE_DEFAULT) -> None:
        cp = L.llama_context_default_params()
        cp.ctx_type = ctx_type  # LLAMA_CONTEXT_TYPE_MTP: the NextN block's graph (skippy.runtime.mtp)
        cp.n_ctx = params.n_ctx
        cp.n_seq_max = params.n_seq_max
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch
        cp.n_threads = params.n_threads
        cp.n_outputs_max = params.n_outputs_max
        cp.n_threads_batch = params.n_threads
        cp.kv_unified = True
        cp.swa_full = True
        cp.no_perf = True
        cp.type_k = int(GGMLQuantizationType[params.cache_type_k.upper()])
        cp.type_v = int(GGMLQuantizationType[params.cache_type_v.upper()])
        cp.flash_attn_type = _FLASH_ATTN[params.flash_attn_type]
        if params.offload_kqv is not None:
            cp.offload_kqv = params.offload_kqv
        if params.op_offload is not None:
            cp.op_offload = params.op_offload
        cp.n_rs_seq = params.n_rs_seq
        if eval_callback is not None:
            cp.cb_eval = eval_callback
            cp.cb_eval_user_data = eval_user_data
        clear_llama_log()
        ptr = L.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise ModelError(f"llama.cpp could not create a context for {model.path}: {last_llama_error()}")
        self.ptr = ptr
        self.memory = L.llama_get_memory(ptr)
        self._eval_callback = eval_callback  # keep the ctypes thunk alive as long as the context

    def decode(self, batch: L.llama_batch) -> None:
        rc = L.llama_decode(self.ptr, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}: {last_llama_error()}")

    def seq_pos_max(self, seq: int) -> int:
        return int(L.llama_memory_seq_pos_max(self.memory, seq))

    def seq_rm(self, seq: int, p0: int) -> None:
        if not L.llama_memory_seq_rm(self.memory, seq, p0, -1):
            raise RuntimeError(f"llama.cpp refused to trim sequence {seq} to position {p0}")

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Give sequence `dst` the cells `src` holds at positions [p0, p1) (shared with the unified KV, not copied)."""
        L.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def logits_row(self, index: int, n_vocab: int) -> np.ndarray:
        """A view of the logits of output row `index` (valid until the next decode)."""
        ptr = L.llama_get_logits_ith(self.ptr, index)
        if not ptr:
            raise RuntimeError(f"no logits for batch row {index}")
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,))

    def close(self) -> None:
        if self.ptr:
            L.llama_free(self.ptr)
            self.ptr = None


class BatchBuffers:
    """A `llama_batch` whose arrays are numpy buffers owned here (sized once for n_batch rows)."""

    def __init__(self, n_batch: int, n_seq_max: int) -> None:
        self.token = np.zeros(n_batch, np.int32)
        self.pos = np.zeros(n_batch, np.int32)
        self.n_seq_id = np.ones(n_batch, np.int32)
        self.logits = np.zeros(n_batch, np.int8)
        self._seq_ids = np.arange(n_seq_max, dtype=np.int32)
        # seq_id[i] is a pointer to one int32 holding row i's sequence id.
        self._seq_ptrs = np.zeros(n_batch, np.uint64)
        self._seq_base = self._seq_ids.ctypes.data

    def build(self, n_rows: int, seq: np.ndarray, *, embd: np.ndarray | None = None) -> L.llama_batch:
        """Point a llama_batch at the first n_rows (token, pos, logits must already be filled); with `embd`
        (C-contiguous float32 [n_rows, n_embd], read-only is fine) the batch reads it in place."""
        self._seq_ptrs[:n_rows] = self._seq_base + 4 * seq.astype(np.uint64)
        batch: Any = L.llama_batch()  # llama-cpp-python types its pointer fields as arrays
        batch.n_tokens = n_rows
        if embd is not None:
            batch.embd = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        else:
            batch.token = self.token.ctypes.data_as(ctypes.POINTER(L.llama_token))
        batch.pos = self.pos.ctypes.data_as(ctypes.POINTER(L.llama_pos))
        batch.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(self._seq_ptrs.ctypes.data, ctypes.POINTER(ctypes.POINTER(L.llama_seq_id)))
        batch.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        return batch
