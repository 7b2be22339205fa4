"""Draft-model proposer: a whole small GGUF in the stage-0 process drafts tokens greedily for every session.

`DraftModelProposerFactory` loads the draft model once (`--openai-draft-model-path`, its layers on the
GPU with `--openai-draft-n-gpu-layers`) with one llama.cpp context whose unified KV holds one sequence
("lane") per session. At construction the draft's vocabulary must equal the target's token for token
(size, every token's text and attributes, bos/eos/eot); otherwise it refuses with a `ModelError` naming
both files and the first difference, since a draft token id must mean the same token to the target.

A session's `DraftModelProposer` keeps the committed history; `extend` only appends to it. `propose(k)`
decodes the history tokens not yet in the draft's KV (chunks of at most n_batch rows, logits on the last
row only), then greedily decodes one token per step (argmax of the draft's logits) and finally trims the
lane back to the history length, so rejected drafts never stay in the draft's KV. Not thread-safe: one
owner (the driver's loop) calls every proposer of a factory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import llama_cpp as L
import numpy as np

from skippy.runtime.errors import ModelError, RuntimeUsageError
from skippy.runtime.llama_api import BatchBuffers, ContextParams, LlamaContext, default_threads
from skippy.runtime.llama_model import LlamaModel, ModelLoadParams
from skippy.runtime.models import resolve_model_path

DEFAULT_N_BATCH = 256  # rows per catch-up decode; a draft step decodes one row

_SPECIAL_TOKENS: tuple[tuple[str, Callable[..., int]], ...] = (
    ("bos", L.llama_vocab_bos),
    ("eos", L.llama_vocab_eos),
    ("eot", L.llama_vocab_eot),
)


def _token_table(model: LlamaModel) -> list[tuple[str, int]]:
    """(text, attributes) of every token id: a walk of the vocabulary (measured: docs/measurements.md, 'Vocabulary walks')."""
    text, attr = L.llama_vocab_get_text, L.llama_vocab_get_attr
    return [(text(model.vocab, i).decode("utf-8", "backslashreplace"), int(attr(model.vocab, i)))
            for i in range(model.n_vocab)]


def vocab_mismatch(draft: LlamaModel, target: LlamaModel) -> str | None:
    """Why `draft` and `target` do not share a vocabulary (the first difference found), or None."""
    if draft.n_vocab != target.n_vocab:
        return f"the draft has {draft.n_vocab} tokens, the target {target.n_vocab}"
    for name, special in _SPECIAL_TOKENS:
        ours, theirs = int(special(draft.vocab)), int(special(target.vocab))
        if ours != theirs:
            return f"the {name} token id is {ours} in the draft, {theirs} in the target"
    ours_table, theirs_table = _token_table(draft), _token_table(target)
    if ours_table == theirs_table:
        return None
    i = next(i for i, (a, b) in enumerate(zip(ours_table, theirs_table)) if a != b)
    (text_a, attr_a), (text_b, attr_b) = ours_table[i], theirs_table[i]
    if text_a != text_b:
        return f"token id {i} is {text_a!r} in the draft, {text_b!r} in the target"
    return f"token id {i} ({text_a!r}) has attributes {attr_a:#x} in the draft, {attr_b:#x} in the target"


def check_same_vocab(draft: LlamaModel, target: str | Path | LlamaModel) -> None:
    """Raise ModelError naming both files unless `draft` has exactly the target's vocabulary."""
    target_model = target if isinstance(target, LlamaModel) else LlamaModel(resolve_model_path(target), vocab_only=True)
    try:
        reason = vocab_mismatch(draft, target_model)
    finally:
        if target_model is not target:
            target_model.close()
    if reason is not None:
        raise ModelError(f"draft model {draft.path} does not share the vocabulary of the target model "
                         f"{target_model.path}: {reason}")


class DraftModelProposer:
    """One session's view of the draft model: its committed history and how much of it is in the lane's KV."""

    def __init__(self, factory: DraftModelProposerFactory, session_id: int, lane: int) -> None:
        self._factory = factory
        self.session_id = session_id
        self.lane = lane
        self._history: list[int] = []
        self._n_cached = 0  # history positions held in the lane's KV
        self._next: int | None = None  # the draft's greedy token after the whole history, once known
        self._closed = False

    def extend(self, tokens: Sequence[int]) -> None:
        self._check_open()
        n_vocab = self._factory.model.n_vocab
        new = [int(t) for t in tokens]
        bad = next((t for t in new if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise RuntimeUsageError(f"session {self.session_id}: token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
        if new:
            self._history += new
            self._next = None

    def propose(self, max_tokens: int) -> list[int]:
        self._check_open()
        n = len(self._history)
        k = min(max_tokens, self._factory.ctx_size - n)  # drafts past the context could never be verified
        if k <= 0 or n == 0:
            return []
        factory = self._factory
        factory.trim(self.lane, self._n_cached)  # a decode that failed midway may have left rows behind
        if self._next is None:
            self._next = factory.decode(self.lane, self._history[self._n_cached :], self._n_cached)
            self._n_cached = n
        drafts = [self._next]
        try:
            while len(drafts) < k:
                drafts.append(factory.decode(self.lane, drafts[-1:], n + len(drafts) - 1))
        finally:
            factory.trim(self.lane, n)
        return drafts

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._factory.release(self)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeUsageError(f"session {self.session_id}: the draft-model proposer is closed")


class DraftModelProposerFactory:
    """The draft model and its context (one KV lane per session); makes each session's proposer."""

    name = "draft-model"
    runs_llama = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        target_vocab_model: str | Path | LlamaModel,
        lane_count: int,
        ctx_size: int,
        kv_pool_cells: int = 0,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
    ) -> None:
        """`kv_pool_cells`: the target's KV pool (0: a context per lane). The sessions' histories fit in it,
        and one session at a time drafts past its history, within its context."""
        if lane_count < 1 or ctx_size < 1 or n_batch < 1:
            raise ModelError(f"draft model needs lane_count, ctx_size and n_batch >= 1, got {lane_count}, {ctx_size}, {n_batch}")
        self.lane_count = lane_count
        self.ctx_size = ctx_size
        self.model = LlamaModel(resolve_model_path(model_path), load=ModelLoadParams(n_gpu_layers=n_gpu_layers))
        try:
            check_same_vocab(self.model, target_vocab_model)
            n_ctx = min(ctx_size * lane_count, kv_pool_cells + ctx_size) if kv_pool_cells else ctx_size * lane_count
            rows = min(n_batch, n_ctx)
            # one logits row per decode; llama.cpp reserves at least one output row per sequence anyway
            self.params = ContextParams(n_ctx=n_ctx, n_seq_max=lane_count, n_batch=rows, n_ubatch=rows,
                                        n_threads=n_threads or default_threads(), n_outputs_max=lane_count)
            self.ctx = LlamaContext(self.model, self.params)
        except BaseException:
            self.model.close()
            raise
        self._buffers = BatchBuffers(rows, lane_count)
        self._free_lanes = list(range(lane_count - 1, -1, -1))
        self._sessions: dict[int, DraftModelProposer] = {}

    def for_session(self, session_id: int) -> DraftModelProposer:
        if self.ctx.ptr is None:
            raise RuntimeUsageError("the draft model is closed")
        if session_id in self._sessions:
            raise RuntimeUsageError(f"session {session_id} already has a draft-model proposer")
        if not self._free_lanes:
            raise RuntimeUsageError(
                f"session {session_id}: all {self.lane_count} draft-model lanes are busy"
                " (close a session's proposer first, or raise lane_count)"
            )
        proposer = self._sessions[session_id] = DraftModelProposer(self, session_id, self._free_lanes.pop())
        return proposer

    @property
    def free_lanes(self) -> int:
        return len(self._free_lanes)

    def decode(self, lane: int, tokens: Sequence[int], pos: int) -> int:
        """Decode `tokens` into the lane at positions pos.. (chunks of at most n_batch rows, logits on each
        chunk's last row); returns the draft's greedy token after the last one."""
        buf, n_batch = self._buffers, self.params.n_batch
        token = -1
        for lo in range(0, len(tokens), n_batch):
            chunk = tokens[lo : lo + n_batch]
            m = len(chunk)
            buf.token[:m] = chunk
            buf.pos[:m] = np.arange(pos, pos + m, dtype=np.int32)
            buf.logits[:m] = 0
            buf.logits[m - 1] = 1
            self.ctx.decode(buf.build(m, np.full(m, lane, np.int32)))
            token = int(np.argmax(self.ctx.logits_row(m - 1, self.model.n_vocab)))
            pos += m
        return token

    def trim(self, lane: int, length: int) -> None:
        """Drop the lane's KV at positions >= length."""
        if self.ctx.seq_pos_max(lane) >= length:
            self.ctx.seq_rm(lane, length)

    def release(self, proposer: DraftModelProposer) -> None:
        """Free a closed proposer's lane (its KV is dropped) for the next session."""
        if self._sessions.get(proposer.session_id) is not proposer:
            return
        del self._sessions[proposer.session_id]
        if self.ctx.ptr is not None:
            self.trim(proposer.lane, 0)
        self._free_lanes.append(proposer.lane)

    def close(self) -> None:
        for proposer in list(self._sessions.values()):
            proposer.close()
        self.ctx.close()
        self.model.close()
