"""The llama.cpp context parameters of a stage: KV cells, batch sizes and output rows for its lanes.

The lanes share one pool of `kv_pool_cells` cells (llama.cpp's unified KV cache; skippy.runtime.context_size decides
it, stage 0 accounts for it: skippy.driver.cell_pool; the prefix cache's entries are kept outside it, as sequence
state: skippy.runtime.entry_states); one llama.cpp sequence per lane; the final stage keeps
logits for a verify window of MAX_DRAFT_TOKENS drafts on every lane at once, other stages for one row (llama.cpp
reserves one output row per sequence anyway).
"""

from __future__ import annotations

from skippy.runtime.llama_api import ContextParams, default_threads
from skippy.runtime.spec import RuntimeSpec

MAX_DRAFT_TOKENS = 16  # longest speculative draft a verify window may carry (sizes the final stage's logits)


def context_params(spec: RuntimeSpec, is_final: bool, recurrent: bool) -> ContextParams:
    """`spec` sized (skippy.runtime.context_size.sized_spec); `recurrent`: a family whose state rewinds by
    llama.cpp's per-token snapshots (n_rs_seq)."""
    n_ctx = spec.kv_pool_cells
    if n_ctx < spec.ctx_size:
        raise ValueError(f"kv_pool_cells {n_ctx} holds less than one context ({spec.ctx_size}): size the spec first")
    n_seq_max = spec.lane_count
    n_batch = spec.n_batch or min(2048, n_ctx)
    # llama.cpp sizes its compute and output buffers for n_outputs_max rows of n_vocab logits
    # (512 rows of Gemma's 262k vocab would be 512 MiB), so keep it to what is asked for.
    # llama.cpp also reserves at least one output row per sequence. A verify window of
    # MAX_DRAFT_TOKENS drafts wants logits on all its rows, for every lane at once.
    wanted = spec.n_outputs_max or (MAX_DRAFT_TOKENS + 1) * spec.lane_count if is_final else 1
    n_outputs_max = max(min(wanted, n_batch), n_seq_max)
    return ContextParams(
        n_ctx=n_ctx,
        n_seq_max=n_seq_max,
        n_batch=n_batch,
        n_ubatch=spec.n_ubatch or min(512, n_batch),
        n_threads=spec.n_threads or default_threads(),
        n_outputs_max=n_outputs_max,
        cache_type_k=spec.cache_type_k,
        cache_type_v=spec.cache_type_v,
        flash_attn_type="enabled" if spec.deterministic else spec.flash_attn_type,
        offload_kqv=spec.kv_offload,
        op_offload=spec.op_offload,
        n_rs_seq=MAX_DRAFT_TOKENS if recurrent else 0,
    )
