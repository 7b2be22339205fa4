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
import functools
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp as L
import numpy as np

from skippy.runtime.errors import ModelError
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.llama_api import ContextParams, LlamaContext
from skippy.runtime.llama_model import LlamaModel, ModelLoadParams

# llama-ext.h's staging API is exported without C linkage (C++-mangled names, as `nm -D libllama.so` shows),
# so it is bound by those names, on first use (a build without it then fails only where MTP is asked for).
_NEXTN_SYMBOLS: dict[str, tuple[str, list[Any], Any]] = {
    "set": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
    "get": ("_Z26llama_get_embeddings_nextnP13llama_context", [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)),
    "get_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", [ctypes.c_void_p, ctypes.c_int32],
                ctypes.POINTER(ctypes.c_float)),
}


@functools.cache
def _nextn(name: str) -> Any:
    symbol, argtypes, restype = _NEXTN_SYMBOLS[name]
    try:
        fn = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libllama.so"))[symbol]
    except (OSError, AttributeError) as error:
        raise ModelError(f"this llama.cpp build lacks {symbol} (llama-ext.h), which native MTP needs: {error}") from None
    fn.argtypes, fn.restype = argtypes, restype
    return fn


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


def sidecar_problems(target: Path, sidecar: Path) -> list[str]:
    """Why the MTP-only GGUF `sidecar` cannot draft for `target` (its vocabulary, n_embd, NextN block), from
    the files' metadata: `skippy up` checks before anything starts, the final stage again at load."""
    facts = []
    for path in (target, sidecar):
        gguf = GGUFFile(path)
        try:
            arch = gguf.get("general.architecture")
            tokens = gguf.get("tokenizer.ggml.tokens")
            n_block, n_nextn = gguf.get(f"{arch}.block_count"), gguf.get(f"{arch}.nextn_predict_layers") or 0
            nextn = isinstance(n_block, int) and isinstance(n_nextn, int) and n_nextn > 0 and any(
                t.name == f"blk.{n_block - n_nextn}.nextn.eh_proj.weight" for t in gguf.tensors)
            facts.append((len(tokens) if isinstance(tokens, list) else 0, gguf.get(f"{arch}.embedding_length"), nextn))
        finally:
            gguf.close()
    (vocab, n_embd, _), (s_vocab, s_embd, s_nextn) = facts
    problems = [f"vocabulary of {s_vocab} tokens, not {vocab}"] if s_vocab != vocab else []
    problems += [f"n_embd {s_embd}, not {n_embd}"] if s_embd != n_embd else []
    return problems + ([] if s_nextn else ["no NextN (MTP) layers"])


def sidecar_refusal(target: Path, sidecar: Path) -> str:
    """The one-line refusal of a sidecar that does not fit ('' when it does)."""
    problems = sidecar_problems(target, sidecar)
    return (f"--openai-native-mtp-draft-model-path {sidecar} does not fit the target model {target}: "
            f"{'; '.join(problems)}") if problems else ""


def load_sidecar(path: Path, target: LlamaModel, load: ModelLoadParams) -> LlamaModel:
    """An External MTP GGUF, refused (naming both files) unless its vocabulary and n_embd match the target's."""
    refusal = sidecar_refusal(target.path, path)
    if refusal:
        raise ModelError(refusal)
    return LlamaModel(path, load=load, load_mtp=True)


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
        _nextn("set")(trunk.ptr, True, False)  # a hidden row for every decoded row, not just outputs
        self.ctx = LlamaContext(model, params, ctx_type=L.LLAMA_CONTEXT_TYPE_MTP)
        _nextn("set")(self.ctx.ptr, True, True)  # the block's own h, for chained drafts
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
        ptr = _nextn("get")(self._trunk.ptr)
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
            ptr = _nextn("get_ith")(self.ctx.ptr, 0)
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
