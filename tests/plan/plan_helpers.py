"""Synthetic model facts and cost tables the planner tests share (no model file, no llama.cpp)."""

from __future__ import annotations

from pathlib import Path

from skippy.plan.costs import ROWS, ComputeCosts
from skippy.plan.memory import MIB, ModelFacts, ServingShape

N_LAYER = 12
SHAPE = ServingShape(lane_count=4, ctx_size=256, prefix_cache=False)


def facts(head_mib: float = 40.0) -> ModelFacts:
    return ModelFacts(path=Path("synthetic.gguf"), architecture="llama", n_layer=N_LAYER, n_embd=512, n_ff=1024,
                      n_vocab=32000, layer_bytes=(10 * MIB,) * N_LAYER, layer_repacked_bytes=(0,) * N_LAYER,
                      embed_bytes=int(head_mib * MIB), embed_row_bytes=1024, head_bytes=int(head_mib * MIB),
                      tied=True, norm_bytes=4096, kv_bytes_f16=(2048,) * N_LAYER,
                      file_bytes=int((10 * N_LAYER + head_mib) * MIB))


def costs(layer_ms: float = 1.0, head: float = 6.0) -> ComputeCosts:
    """Linear-ish in rows: 1 row costs `layer_ms`, 16 rows 4x that (decode is weight-bound)."""
    scale = (1.0, 1.8, 4.0)
    return ComputeCosts(rows=ROWS, layer_ms=tuple(tuple(layer_ms * s for s in scale) for _ in range(N_LAYER)),
                        embed_ms=tuple(0.1 * s for s in scale), head_ms=tuple(head * layer_ms * s for s in scale))
