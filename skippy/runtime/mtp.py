"""Native MTP drafting at the final stage: llama.cpp's NextN block run as a second context on the trunk's state.

The final stage's trunk context exports, for every row it decodes, the hidden state before the output norm
(llama.cpp's `h_nextn`, `llama_set_embeddings_nextn`); an MTP context (`ctx_type = LLAMA_CONTEXT_TYPE_MTP`)
runs the NextN block. Its input at position p is the token x_p paired with the trunk's hidden state at
p - 1; it predicts x_{p+1}. `observe` runs it over every row the trunk just decoded (the "catch-up": its
own KV follows the trunk's, trimmed by position like it), `draft` chains it from the token the stage just
sampled: (token, h_{p-1}) -> d1, then (d1, the block's own h) -> d2, ... greedy (argmax) drafts, which the
next verify window checks, so they never change the output. Integrated: the NextN block is in the final
slice (`load_mtp`); External: a separate MTP-only GGUF (`MtpSource.EXTERNAL`), checked against the target's
vocabulary and n_embd. What the pinned llama.cpp offers and what it lacks: docs/mtp.md.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp as L
import numpy as np

from skippy.runtime.errors import ModelError
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.llama_api import ContextParams, LlamaContext
from skippy.runtime.llama_model import LlamaModel, ModelLoadParams

_llama = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libllama.so"))
# llama-ext.h's staging API is exported without C linkage (C++-mangled names, as `nm -D libllama.so` shows).
_set_embeddings_nextn = _llama["_Z26llama_set_embeddings_nextnP13llama_contextbb"]
_set_embeddings_nextn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
_set_embeddings_nextn.restype = None
_get_embeddings_nextn = _llama["_Z26llama_get_embeddings_nextnP13llama_context"]
_get_embeddings_nextn.argtypes = [ctypes.c_void_p]
_get_embeddings_nextn.restype = ctypes.POINTER(ctypes.c_float)
_get_embeddings_nextn_ith = _llama["_Z30llama_get_embeddings_nextn_ithP13llama_contexti"]
_get_embeddings_nextn_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
_get_embeddings_nextn_ith.restype = ctypes.POINTER(ctypes.c_float)

if TYPE_CHECKING:
    from skippy.runtime.spec import RuntimeSpec

Rows = tuple[int, int, np.ndarray]  # (lane, pos_start, int32 token ids of the window's rows), in batch order


def open_drafter(spec: RuntimeSpec, model: LlamaModel, trunk: LlamaContext,
                 params: ContextParams) -> tuple[MtpDrafter | None, str]:
    """The final stage's MTP context for `spec.mtp`, or None and why not (a slice without NextN tensors: the
    stage runs on without drafts). A sidecar that does not fit is an error (ModelError)."""
    mtp_params = replace(params, n_rs_seq=0)
    if spec.mtp == "external":
        if spec.mtp_draft_model is None:
            raise ModelError("native MTP source 'external' needs --openai-native-mtp-draft-model-path")
        sidecar = load_sidecar(Path(spec.mtp_draft_model), model, spec.load)
        return MtpDrafter(sidecar, trunk, mtp_params, owns_model=True), ""
    if not has_nextn_tensors(model):
        return None, (f"native MTP off: {model.path.name} has no NextN (MTP) layers (a trunk-only GGUF, or one "
                      f"without nextn_predict_layers); the final stage continues without drafts")
    return MtpDrafter(model, trunk, mtp_params), ""


def has_nextn_tensors(model: LlamaModel) -> bool:
    """Whether the file holds the NextN block llama.cpp's MTP graph asserts on (a trunk-only GGUF declares
    nextn_predict_layers but leaves the tensors out; building the MTP context would abort the process)."""
    if int(L.llama_model_n_layer_nextn(model.ptr)) == 0:
        return False
    probe = f"blk.{int(L.llama_model_n_layer(model.ptr))}.nextn.eh_proj.weight"
    gguf = GGUFFile(model.path)
    try:
        return any(t.name == probe for t in gguf.tensors)
    finally:
        gguf.close()


def load_sidecar(path: Path, target: LlamaModel, load: ModelLoadParams) -> LlamaModel:
    """An External MTP GGUF, refused (naming both files) unless its vocabulary and n_embd match the target's."""
    sidecar = LlamaModel(path, load=load, load_mtp=True)
    problems = []
    if sidecar.n_vocab != target.n_vocab:
        problems.append(f"vocabulary of {sidecar.n_vocab} tokens, not {target.n_vocab}")
    if sidecar.n_embd != target.n_embd:
        problems.append(f"n_embd {sidecar.n_embd}, not {target.n_embd}")
    if not problems and not has_nextn_tensors(sidecar):
        problems.append("no NextN (MTP) layers")
    if problems:
        sidecar.close()
        raise ModelError(f"--openai-native-mtp-draft-model-path {path} does not fit the target model "
                         f"{target.path}: {'; '.join(problems)}")
    return sidecar


class MtpDrafter:
    """The MTP context of a final stage (one llama.cpp sequence per lane, as the trunk's)."""

    def __init__(self, model: LlamaModel, trunk: LlamaContext, params: ContextParams, *, owns_model: bool = False) -> None:
        if not has_nextn_tensors(model):
            raise ModelError(f"{model.path} has no NextN (MTP) layers")
        self.model = model
        self._owns_model = owns_model  # an External sidecar: closed with the drafter
        self.n_embd = model.n_embd
        self.n_vocab = model.n_vocab
        self._trunk = trunk
        _set_embeddings_nextn(trunk.ptr, True, False)  # a hidden row for every decoded row, not just outputs
        self.ctx = LlamaContext(model, params, ctx_type=L.LLAMA_CONTEXT_TYPE_MTP)
        _set_embeddings_nextn(self.ctx.ptr, True, True)  # the block's own h, for chained drafts
        self._batch = L.llama_batch_ext_init(self.ctx.ptr)
        self._hidden: dict[int, tuple[int, np.ndarray]] = {}  # lane -> (pos_start, trunk h rows) of its last window
        self._pos = (L.llama_pos * 1)()

    def _hidden_at(self, lane: int, pos: int) -> np.ndarray:
        """The trunk's hidden state at `pos` for the lane (zeros when it is not at hand: draft quality only)."""
        start, rows = self._hidden.get(lane, (0, np.empty((0, self.n_embd), np.float32)))
        return rows[pos - start] if 0 <= pos - start < len(rows) else np.zeros(self.n_embd, np.float32)

    def _add(self, lane: int, token: int, pos: int, hidden: np.ndarray, output: bool) -> None:
        idx = L.llama_batch_ext_add_token(self._batch, lane, int(token))
        if idx < 0:
            raise RuntimeError(f"MTP batch refused a row (error {idx})")
        self._pos[0] = pos
        embd = L.llama_embd(hidden.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
        if not (L.llama_batch_ext_set_pos(self._batch, idx, self._pos)
                and L.llama_batch_ext_set_embd_token(self._batch, idx, embd)):
            raise RuntimeError("MTP batch refused a row's position or hidden state")
        if output:
            L.llama_batch_ext_set_output_logits(self._batch, idx, True)

    def _process(self) -> None:
        rc = L.llama_process(self.ctx.ptr, L.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise RuntimeError(f"MTP decode failed with code {rc}")

    def observe(self, windows: list[Rows]) -> None:
        """After the trunk decoded these windows (rows in batch order): run the NextN block over the same
        positions, each row's token paired with the trunk's hidden state one position earlier."""
        n_rows = sum(len(tokens) for _, _, tokens in windows)
        ptr = _get_embeddings_nextn(self._trunk.ptr)
        if not ptr:
            raise RuntimeError("the trunk context exported no hidden states (embeddings_nextn)")
        hidden = np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_embd)).copy()
        L.llama_batch_ext_clear(self._batch)
        keep = []  # the rows' hidden inputs stay alive until the decode
        row = 0
        for lane, pos_start, tokens in windows:
            self.ctx.seq_rm(lane, pos_start)
            for k, token in enumerate(tokens):
                h = self._hidden_at(lane, pos_start - 1) if k == 0 else hidden[row + k - 1]
                keep.append(h)
                self._add(lane, int(token), pos_start + k, h, False)
            self._hidden[lane] = (pos_start, hidden[row:row + len(tokens)])
            row += len(tokens)
        self._process()
        del keep

    def draft(self, lane: int, token: int, pos: int, n: int) -> tuple[int, ...]:
        """Up to n greedy drafts after `token`, the sample for position `pos` (not yet decoded by the trunk)."""
        out: list[int] = []
        hidden = self._hidden_at(lane, pos - 1).copy()
        self.ctx.seq_rm(lane, pos)
        for i in range(n):
            L.llama_batch_ext_clear(self._batch)
            self._add(lane, token, pos + i, hidden, True)
            self._process()
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx.ptr, 0), shape=(self.n_vocab,))
            token = int(np.argmax(logits))
            out.append(token)
            ptr = _get_embeddings_nextn_ith(self.ctx.ptr, 0)
            if not ptr:
                break
            hidden = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()
        return tuple(out)

    def release(self, lane: int) -> None:
        self._hidden.pop(lane, None)
        self.ctx.seq_rm(lane, 0)

    def close(self) -> None:
        if self._batch:
            L.llama_batch_ext_free(self._batch)
            self._batch = None
        self.ctx.close()
        if self._owns_model:
            self.model.close()
