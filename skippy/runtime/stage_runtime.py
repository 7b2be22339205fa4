"""StageRuntime: one stage's layer range `[layer_start, layer_end)` executed by llama.cpp.

The first stage takes token ids, later stages take the previous stage's hidden states as embedding
input. A non-final stage returns the hidden state of its last layer for every input row (read with
the context's eval callback, compiled C where a compiler is at hand (skippy.runtime.capture), which
stops the graph before the stop block and the vocabulary projection); the final stage keeps logits
only for the rows that ask for them and samples with a per-session sampler chain. Each session is
one llama.cpp sequence ("lane"); one decode call may carry windows from many sessions. Positions
are authoritative: a session whose KV runs past a window's `pos_start` is trimmed first. With
`prefix_entries` the stage keeps a prefix cache (`prefix_cache`): windows may restore, record and
evict its entries. A recurrent family (skippy.runtime.families: LFM2) keeps no prefix cache
(`prefix_cache_off` says why), rewinds only inside a session's last window (llama.cpp's n_rs_seq
snapshots), and its non-final stage decodes mixed-length windows one by one. After loading, the slice
file's pages leave the process (skippy.runtime.resident): what stays resident is what the stage reads.
Not thread-safe: one thread at a time (skippy.stage.worker) calls a runtime.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

import llama_cpp as L
import numpy as np

from skippy.protocol import TokenLogprob
from skippy.runtime.capture import eval_capture
from skippy.runtime.context_size import sized_spec
from skippy.runtime.entry_states import EntryStates
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.families import FAMILIES
from skippy.runtime.lane_contexts import LaneContexts
from skippy.runtime.llama_api import (
    BatchBuffers,
    LlamaContext,
)
from skippy.runtime.llama_model import LlamaModel
from skippy.runtime.mtp import MtpDrafter, open_drafter
from skippy.runtime.prefix_cache import KvSequences, PrefixCache, keep_rows, kv_cell_bytes, with_missed
from skippy.runtime.resident import drop_mapped_pages
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.session_samplers import SessionSamplers
from skippy.runtime.slices import Progress
from skippy.runtime.spec import RuntimeSpec, resolve_artifact
from skippy.runtime.stage_params import MAX_DRAFT_TOKENS, context_params
from skippy.runtime.windows import DecodeResult, SessionWindow


class StageRuntime:
    def __init__(self, spec: RuntimeSpec, progress: Progress | None = None) -> None:
        artifact = resolve_artifact(spec, progress)
        spec = sized_spec(spec)  # its context and KV pool decided (skippy.runtime.context_size)
        self.spec = spec
        self.model_digest = artifact.digest
        self.layer_start, self.layer_end = spec.layer_start, spec.layer_end
        self.is_first = spec.layer_start == 0
        self.is_final = spec.layer_end == artifact.n_layer
        self.family = FAMILIES[artifact.architecture]
        if spec.deterministic and self.family.recurrent:
            raise RuntimeUsageError(f"deterministic: not supported for {artifact.architecture}, whose recurrent state"
                                    " llama.cpp updates per ubatch (serve it without --deterministic)")
        # recurrent layers: no prefix cache (`prefix_cache_off` says why), rewinds inside the last window only
        self.prefix_cache_off = self.family.refusal() if spec.prefix_entries else ""
        prefix_entries = 0 if self.prefix_cache_off else spec.prefix_entries
        self._last_window: dict[int, tuple[int, int]] = {}  # recurrent: session -> its last window's [start, end)
        if spec.deterministic:
            os.environ["GGML_CPU_TILED_MM"] = "0"  # K-quant tiles from 8 rows (tiled.cpp:1204); read once per process
        # native MTP needs the shared trunk context it reads hidden states from: not under --deterministic
        wants_mtp = self.is_final and spec.mtp != "disabled" and not spec.deterministic
        # deterministic: no repacked weights (their gemm and gemv kernels differ by row count)
        load = replace(spec.load, repack=False) if spec.deterministic else spec.load
        self.model = LlamaModel(artifact.load_path, load=load, load_mtp=wants_mtp and spec.mtp == "integrated")
        self.n_embd = self.model.n_embd
        self.n_vocab = self.model.n_vocab
        self.params = context_params(spec, self.is_final, self.family.recurrent)
        # The real last layer of a non-final slice; the stop block after it never runs.
        self._capture_hook = None if self.is_final else eval_capture(f"l_out-{spec.layer_end - spec.layer_start - 1}".encode())
        self.eval_callback = "none" if self._capture_hook is None else self._capture_hook.kind
        hook = self._capture_hook
        # --deterministic: one context per lane (skippy.runtime.lane_contexts); else one shared by every lane
        self.lanes = LaneContexts(self.model, self.params, spec.lane_count, spec.ctx_size, hook) if spec.deterministic else None
        hook_args = (hook.callback, hook.user_data) if hook else ()
        self._shared = None if self.lanes else LlamaContext(self.model, self.params, *hook_args)
        # prefix cache entries as sequence-state bytes, outside the pool (skippy.runtime.entry_states)
        self.kv: KvSequences = self.lanes or self._shared_lanes(spec.lane_count)
        # native MTP drafting (skippy.runtime.mtp); `mtp_off` says why a final stage asked for it runs without
        self.mtp: MtpDrafter | None = None
        self.mtp_off = ""
        if self.is_final and spec.mtp != "disabled" and spec.deterministic:
            self.mtp_off = "native MTP off under --deterministic (it drafts from the shared trunk context)"
        if wants_mtp:
            self.mtp, self.mtp_off = open_drafter(spec, self.model, self.ctx, self.params)
        drop_mapped_pages(artifact.load_path)  # what this stage reads faults back in; the rest stays out of its RSS
        self._buffers = BatchBuffers(self.params.n_batch, spec.lane_count)
        self._lanes: dict[int, int] = {}
        self._free_lanes = list(range(spec.lane_count - 1, -1, -1))
        self._samplers = SessionSamplers(self.n_vocab, self.model.vocab)
        self.prefix: PrefixCache | None = None
        if prefix_entries:
            cell_bytes = kv_cell_bytes(artifact.load_path, spec.cache_type_k, spec.cache_type_v)
            # entries are kept outside the pool: by default in at most as many cells' bytes as the pool has
            cells = spec.prefix_max_bytes // cell_bytes if spec.prefix_max_bytes else spec.kv_pool_cells
            sliding = L.llama_model_n_swa(self.model.ptr) > 0  # its kept state: the last window's positions only
            self.prefix = PrefixCache(self.kv, self._lanes, spec.lane_count, prefix_entries, cells, cell_bytes,
                                      partial=not sliding)

    def _shared_lanes(self, lane_count: int) -> EntryStates:
        shared = self.ctx
        return EntryStates(lane_count, lambda lane: (shared, lane))

    @property
    def ctx(self) -> LlamaContext:
        """The context every lane shares (not under --deterministic, where each lane has its own)."""
        if self._shared is None:
            raise RuntimeUsageError("deterministic: every lane has its own llama.cpp context")
        return self._shared

    def _output(self, batch_row: int) -> tuple[LlamaContext, int]:
        """The context holding an output row of the last decode, and the row's index in that context's batch."""
        return self.lanes.output(batch_row) if self.lanes else (self.ctx, batch_row)

    # -- sessions ------------------------------------------------------------------------------
    @property
    def active_sessions(self) -> list[int]:
        return list(self._lanes)

    def session_length(self, session_id: int) -> int:
        """Positions held in KV for the session (0 for an unknown one)."""
        lane = self._lanes.get(session_id)
        return 0 if lane is None else self.kv.seq_pos_max(lane) + 1

    def _lane_for(self, session_id: int) -> int:
        lane = self._lanes.get(session_id)
        if lane is None:
            if not self._free_lanes:
                raise RuntimeUsageError(
                    f"session {session_id}: all {self.spec.lane_count} lanes are busy (raise lane_count)"
                )
            lane = self._lanes[session_id] = self._free_lanes.pop()
        return lane

    def configure_session(self, session_id: int, params: SamplingParams, history: Sequence[int] = (),
                          draws: int = 0) -> None:
        """Set the sampler for a session (final stage); replaces any earlier one. A replayed session's
        `history` (committed tokens) and `draws` (RNG draws made) restore its state (`SamplerChain.restore`)."""
        self._samplers.configure(session_id, params, history, draws)

    def trim_session(self, session_id: int, pos: int) -> None:
        """Drop the session's KV at positions >= pos."""
        lane = self._lanes.get(session_id)
        if lane is not None and self.kv.seq_pos_max(lane) >= pos:
            if self.family.recurrent and pos > 0:
                self._check_rewind(session_id, pos)
            self.kv.seq_rm(lane, pos)

    def _check_rewind(self, session_id: int, pos: int) -> None:
        """A recurrent state rewinds only to a position inside the session's last window (llama.cpp keeps
        its per-token snapshots for that window alone): anything else would continue from a wrong state."""
        start, end = self._last_window.get(session_id, (0, 0))
        if not start < pos <= end or end - pos > MAX_DRAFT_TOKENS:
            raise RuntimeUsageError(
                f"session {session_id}: {self.family.architecture} keeps recurrent state, which rewinds only to a "
                f"position inside the session's last window [{start}, {end}) (at most {MAX_DRAFT_TOKENS} back), "
                f"not to {pos}; start the session again from position 0"
            )

    def release_session(self, session_id: int) -> None:
        """Forget a session: its KV, its sampler, and its lane (which becomes reusable)."""
        lane = self._lanes.pop(session_id, None)
        self._last_window.pop(session_id, None)
        if lane is not None:
            self.kv.seq_rm(lane, 0)
            if self.mtp is not None:
                self.mtp.release(lane)
            self._free_lanes.append(lane)
        if self.prefix is not None:
            self.prefix.release(session_id)
        self._samplers.release(session_id)

    # -- decode --------------------------------------------------------------------------------
    def _check_windows(self, windows: list[SessionWindow], hidden: np.ndarray | None) -> int:
        n_rows = sum(w.n_tokens for w in windows)
        if not windows or n_rows == 0:
            raise RuntimeUsageError("empty batch")
        if n_rows > self.params.n_batch:
            raise RuntimeUsageError(f"batch of {n_rows} rows exceeds n_batch {self.params.n_batch}")
        if len({w.session_id for w in windows}) != len(windows):
            raise RuntimeUsageError("a session appears twice in one batch")
        new_sessions = sum(1 for w in windows if w.session_id not in self._lanes)
        if new_sessions > len(self._free_lanes):
            raise RuntimeUsageError(
                f"batch opens {new_sessions} new sessions but only {len(self._free_lanes)} of "
                f"{self.spec.lane_count} lanes are free (raise lane_count)"
            )
        for w in windows:
            if w.n_tokens <= 0 or w.pos_start < 0 or w.pos_start + w.n_tokens > self.spec.ctx_size:
                raise RuntimeUsageError(
                    f"session {w.session_id}: positions [{w.pos_start}, {w.pos_start + w.n_tokens}) "
                    f"outside the context of {self.spec.ctx_size} (ctx_size)"
                )
            if any(not 0 <= o < w.n_tokens for o in w.outputs):
                raise RuntimeUsageError(f"session {w.session_id}: output offsets {w.outputs} outside the window")
            if self.is_first and (w.tokens is None or len(w.tokens) != w.n_tokens):
                raise RuntimeUsageError(f"session {w.session_id}: the first stage needs {w.n_tokens} token ids")
            if self.session_length(w.session_id) < w.pos_start:
                raise RuntimeUsageError(
                    f"session {w.session_id}: window starts at {w.pos_start} "
                    f"but only {self.session_length(w.session_id)} positions are in KV"
                )
        n_outputs = sum(len(w.outputs) for w in windows) if self.is_final else 0
        if n_outputs > self.params.n_outputs_max:
            raise RuntimeUsageError(
                f"batch asks for {n_outputs} output rows, more than n_outputs_max {self.params.n_outputs_max}"
            )
        if not self.is_first:
            expected = (n_rows, self.n_embd)
            if hidden is None or hidden.shape != expected or hidden.dtype != np.float32:
                got = None if hidden is None else (hidden.shape, hidden.dtype)
                raise RuntimeUsageError(f"hidden input must be float32{list(expected)}, got {got}")
        return n_rows

    def decode(self, windows: list[SessionWindow], hidden: np.ndarray | None = None) -> DecodeResult:
        """Run this stage's layers over the windows (rows in window order), restoring, evicting and
        recording prefix cache entries as the windows say (a window whose restore misses is dropped)."""
        if self.prefix is None:
            return self._decode(windows, hidden)
        missed = self.prefix.restore(windows, self._lane_for)
        kept, hidden = keep_rows(windows, hidden, missed) if missed else (windows, hidden)
        empty = DecodeResult(None if self.is_final else np.empty((0, self.n_embd), np.float32), [])
        result = self._decode(kept, hidden) if kept else empty
        self.prefix.finish(windows, missed)
        return with_missed(result, windows, missed) if missed else result

    def _decode(self, windows: list[SessionWindow], hidden: np.ndarray | None) -> DecodeResult:
        if self.family.recurrent and not self.is_final and len(windows) > 1 and any(w.n_tokens > 1 for w in windows):
            return self._decode_one_by_one(windows, hidden)
        n_rows = self._check_windows(windows, hidden)
        if self.lanes is not None:
            return self.lanes.decode(windows, hidden, self._lane_for, self.is_final, self.n_embd)
        buf = self._buffers
        lanes = np.empty(n_rows, np.int32)
        buf.logits[:n_rows] = 0
        output_rows: list[list[int]] = []
        row = 0
        for w in windows:
            lane = self._lane_for(w.session_id)
            self.trim_session(w.session_id, w.pos_start)  # positions are authoritative
            end = row + w.n_tokens
            lanes[row:end] = lane
            buf.pos[row:end] = np.arange(w.pos_start, w.pos_start + w.n_tokens, dtype=np.int32)
            if self.is_first:
                assert w.tokens is not None  # checked by _check_windows
                buf.token[row:end] = w.tokens
            if self.family.recurrent:
                self._last_window[w.session_id] = (w.pos_start, w.pos_start + w.n_tokens)
            rows = [row + o for o in w.outputs] if self.is_final else []
            buf.logits[rows] = 1
            output_rows.append(rows)
            row = end
        # embedding input is read in place from the received frame: no copy of the activations
        embd = None if self.is_first else np.ascontiguousarray(hidden, np.float32)
        batch = buf.build(n_rows, lanes, embd=embd)
        if self.is_final:
            self.ctx.decode(batch)
            if self.mtp is not None and all(w.tokens is not None for w in windows):  # the rows' tokens came along
                self.mtp.observe([(self._lanes[w.session_id], w.pos_start, w.tokens) for w in windows
                                  if w.tokens is not None])
            return DecodeResult(hidden=None, output_rows=output_rows)
        hidden_out = np.empty((n_rows, self.n_embd), np.float32)
        assert self._capture_hook is not None
        self._capture_hook.arm(hidden_out)
        self.ctx.decode(batch)
        captured = self._capture_hook.floats()
        if captured != n_rows * self.n_embd:
            raise RuntimeError(f"captured {captured} floats of layer output, expected {n_rows * self.n_embd}")
        return DecodeResult(hidden=hidden_out, output_rows=output_rows)

    def _decode_one_by_one(self, windows: list[SessionWindow], hidden: np.ndarray | None) -> DecodeResult:
        """A recurrent family's non-final stage: llama.cpp regroups the rows of a batch whose windows differ
        in length into equal-length ubatches, out of row order, and the layer output is read in ubatch
        order; one window per decode keeps the rows in order."""
        self._check_windows(windows, hidden)
        parts, row = [], 0
        for w in windows:
            part = self._decode([w], None if hidden is None else hidden[row:row + w.n_tokens])
            assert part.hidden is not None
            parts.append(part.hidden)
            row += w.n_tokens
        return DecodeResult(hidden=np.concatenate(parts), output_rows=[[] for _ in windows])

    def logits(self, batch_row: int) -> np.ndarray:
        """A copy of the logits of an output row of the last decode (final stage)."""
        ctx, row = self._output(batch_row)
        return ctx.logits_row(row, self.n_vocab).copy()

    def sample(self, session_id: int, batch_row: int) -> int:
        """Sample the session's next token from an output row of the last decode (final stage)."""
        return self._samplers.sample(session_id, *self._output(batch_row))

    def mtp_draft(self, session_id: int, token: int, pos: int, n: int) -> tuple[int, ...]:
        """Up to n native-MTP drafts after `token`, sampled for position `pos` ((): no MTP context here)."""
        lane = self._lanes.get(session_id)
        if self.mtp is None or lane is None or n <= 0:
            return ()
        return self.mtp.draft(lane, token, pos, min(n, MAX_DRAFT_TOKENS))

    def draws(self, session_id: int) -> int:
        """RNG draws the session's sampler has made (0: none, or greedy)."""
        return self._samplers.draws(session_id)

    def logprobs(self, session_id: int, batch_row: int, token: int) -> TokenLogprob | None:
        """log p(token) from the row's raw logits (log-softmax) and the top-n, if the session asked."""
        return self._samplers.logprobs(session_id, *self._output(batch_row), token)

    def close(self) -> None:
        self._samplers.close()
        if self.mtp is not None:
            self.mtp.close()
        if self.lanes is not None:
            self.lanes.close()
        if self._shared is not None:
            self._shared.close()
        self.model.close()


