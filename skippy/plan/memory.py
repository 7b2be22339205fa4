"""A stage's memory, predicted from the GGUF: its weights, KV cache, llama.cpp's buffers, the process, headroom.

`ModelFacts` reads the tensor sizes once (skippy.runtime.gguf_file, which uses the `gguf` package's quant
sizes). `stage_memory` adds up what a stage holding `[start, end)` keeps resident when it serves `ServingShape`:

- weights: its blocks (llama.cpp's CPU repack copies Q4_0/Q4_K/IQ4_NL/MXFP4 matrices into anonymous
  memory; the rest stays mapped from the slice file), plus, on a non-final stage, the repacked part of
  the stop block; the first stage the embedding rows it gathers (one page per distinct token, at most
  the KV pool's cells of them, never more than the table); the final stage the output head (the embedding
  itself when tied) and the output norm. A stage drops the pages of its slice it does not use right
  after loading (skippy.runtime.resident), so nothing else of the file stays resident.
- KV: the pool's cells (`kv_pool_cells`, which the lanes and the prefix cache share; default a context per lane)
  over its layers, the stop block included.
- compute: llama.cpp's compute buffer, ubatch x (8 n_embd + 2 n_ff) floats plus the attention masks
  (ubatch x n_ctx), or on the final stage the logits rows it writes when that is larger (`logits_rows`: the
  largest batch of the default speculation's verify windows, which calibration sweeps at startup, or one a
  lane; llama.cpp reserves room for a window on every lane but only fills what a decode asks for), and those
  rows again in its output buffer.
- the process (Python, numpy, pyzmq, llama.cpp's libraries, skippy: 55 MB measured before the model
  loads), llama.cpp's vocabulary, which every stage loads (about 168 bytes a token: 42 MiB for Gemma 3's
  262k), and a headroom of 10%.

Memory that is reserved but never written is not resident and not counted (docs/plan.md compares the
predictions with measured RSS). `refuse_if_too_big` is a stage's check before it loads: a prediction over
the memory cgroup it runs in (a namespace host's `--mem-mb`) refuses to start, naming both.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from skippy.config.errors import ConfigError
from skippy.config.generation import DEFAULT_POLICY_PLAN
from skippy.driver.speculative.policy import window_rows
from skippy.driver.verify_costs import BATCH_ROWS_MAX
from skippy.netns.cgroups import own_memory_limit
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.prefix_cache import kv_layer_bytes
from skippy.runtime.slices import read_model_info

__all__ = ["DEFAULT_SHAPE", "MIB", "ModelFacts", "ServingShape", "StageMemory", "kv_scale", "read_model_facts",
           "refuse_if_too_big", "stage_memory"]

MIB = 1 << 20
PAGE = 4096
PROCESS_BASE_BYTES = 56 * MIB  # a stage process before its model loads (55 MB VmRSS measured, docs/plan.md)
VOCAB_BYTES_PER_TOKEN = 168  # llama.cpp's vocabulary in every stage (Gemma 3's 262k tokens: 42 MiB measured)
HEADROOM = 0.10
_REPACKED = {GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_K, GGMLQuantizationType.IQ4_NL,
             GGMLQuantizationType.MXFP4}


@dataclass(frozen=True)
class ModelFacts:
    """Sizes of one GGUF's parts, in bytes."""

    path: Path
    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_vocab: int
    layer_bytes: tuple[int, ...]  # every tensor of blk.N
    layer_repacked_bytes: tuple[int, ...]  # the part of those llama.cpp's CPU repack copies
    embed_bytes: int  # token_embd
    embed_row_bytes: int
    head_bytes: int  # output.weight, or token_embd when tied
    tied: bool
    norm_bytes: int  # every other non-block tensor (output_norm, ...)
    kv_bytes_f16: tuple[int, ...]  # one KV cell of each layer at f16/f16
    file_bytes: int

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.embed_bytes + (0 if self.tied else self.head_bytes) + self.norm_bytes


@functools.lru_cache(maxsize=8)
def read_model_facts(path: Path) -> ModelFacts:
    info = read_model_info(path)
    gguf = GGUFFile(path)
    try:
        arch = info.architecture
        n_ff = gguf.get(f"{arch}.feed_forward_length")
        layers = [0] * info.n_layer
        repacked = [0] * info.n_layer
        embed = head = norm = nextn = 0
        embed_rows = 1
        for t in gguf.tensors:
            if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= info.n_layer:
                nextn += t.nbytes  # a NextN (MTP) block: it travels with the final stage, as the head does
            elif t.name.startswith("blk."):
                il = int(t.name.split(".")[1])
                layers[il] += t.nbytes
                if len(t.dims) == 2 and GGMLQuantizationType(t.ggml_type) in _REPACKED:
                    repacked[il] += t.nbytes
            elif t.name == "token_embd.weight":
                embed, embed_rows = t.nbytes, t.dims[1]
            elif t.name == "output.weight":
                head = t.nbytes
            else:
                norm += t.nbytes
    finally:
        gguf.close()
    return ModelFacts(path=path, architecture=arch, n_layer=info.n_layer, n_embd=info.n_embd,
                      n_ff=n_ff[0] if isinstance(n_ff, list) else int(n_ff or 4 * info.n_embd),  # type: ignore[call-overload]
                      n_vocab=embed_rows, layer_bytes=tuple(layers), layer_repacked_bytes=tuple(repacked),
                      embed_bytes=embed, embed_row_bytes=embed // max(1, embed_rows), head_bytes=(head or embed) + nextn,
                      tied=head == 0, norm_bytes=norm, kv_bytes_f16=tuple(kv_layer_bytes(path, "f16", "f16")),
                      file_bytes=path.stat().st_size)


@dataclass(frozen=True)
class ServingShape:
    """What every stage is sized for (`skippy up`'s defaults)."""

    lane_count: int = 4
    ctx_size: int = 512
    prefix_cache: bool = True  # `skippy up`'s default: 4 entries per lane, kept beside the pool (their copies fill as
    # they are recorded, up to the pool's bytes: not predicted here)
    kv_scale: float = 1.0  # KV bytes relative to f16 K and V (q8_0: ~0.53)
    kv_pool_cells: int = 0  # the KV cells every lane shares (0: a context per lane)

    @property
    def n_ctx(self) -> int:
        return self.kv_pool_cells or self.lane_count * self.ctx_size

    @property
    def n_seq(self) -> int:
        return self.lane_count * (5 if self.prefix_cache else 1)


DEFAULT_SHAPE = ServingShape()


@dataclass(frozen=True)
class StageMemory:
    """Predicted resident bytes of one stage, by part."""

    weights: int
    kv: int
    compute: int
    process: int = PROCESS_BASE_BYTES  # Python and its libraries, and llama.cpp's vocabulary

    @property
    def headroom(self) -> int:
        return int(HEADROOM * (self.weights + self.kv + self.compute + self.process))

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.process + self.headroom

    def describe(self) -> str:
        parts = (("weights", self.weights), ("KV", self.kv), ("compute", self.compute), ("process", self.process),
                 ("headroom", self.headroom))
        return f"{self.total / MIB:.0f} MiB (" + ", ".join(f"{name} {value / MIB:.0f}" for name, value in parts) + ")"


def logits_rows(lanes: int) -> int:
    """Rows of logits the final stage writes at most: a decode's row per lane, or the default speculation's
    windows, which its startup calibration also sweeps (skippy.driver.verify_costs; at most BATCH_ROWS_MAX)."""
    windows = window_rows(DEFAULT_POLICY_PLAN.verify_window.max_tokens, lanes)
    return max(lanes, min(windows, BATCH_ROWS_MAX))


def stage_memory(facts: ModelFacts, start: int, end: int, shape: ServingShape | None = None) -> StageMemory:
    """What a stage holding layers [start, end) keeps resident serving `shape`."""
    shape = shape or DEFAULT_SHAPE
    first, final = start == 0, end == facts.n_layer
    weights = sum(facts.layer_bytes[start:end])
    kv_layers = list(facts.kv_bytes_f16[start:end])
    if not final:  # the stop block: a copy of the last block, never run, but repacked and given a KV cache
        weights += facts.layer_repacked_bytes[end - 1]
        kv_layers.append(facts.kv_bytes_f16[end - 1])
    if final:
        weights += facts.head_bytes + facts.norm_bytes
    if first and not (final and facts.tied):
        weights += min(facts.embed_bytes, shape.n_ctx * max(PAGE, facts.embed_row_bytes))
    kv = int(shape.n_ctx * sum(kv_layers) * shape.kv_scale)
    ubatch = min(512, shape.n_ctx)
    compute = ubatch * (8 * facts.n_embd + 2 * facts.n_ff) * 4 + ubatch * shape.n_ctx * 4
    if final:  # the logits rows written: the largest batch of the default speculation's windows, or a row a lane
        logits = logits_rows(shape.lane_count) * facts.n_vocab * 4
        compute = max(compute, logits + MIB) + logits  # the graph's logits, then llama.cpp's output buffer
    return StageMemory(weights=weights, kv=kv, compute=compute,
                       process=PROCESS_BASE_BYTES + facts.n_vocab * VOCAB_BYTES_PER_TOKEN)


def kv_scale(cache_type_k: str, cache_type_v: str) -> float:
    """KV bytes of these cache types relative to f16 K and V."""
    per_element = [size / block for block, size in (GGML_QUANT_SIZES[GGMLQuantizationType[t.upper()]]
                                                     for t in (cache_type_k, cache_type_v))]
    return sum(per_element) / 4.0


def refuse_if_too_big(model: Path, start: int, end: int, shape: ServingShape, stage_id: str) -> StageMemory:
    """A stage's predicted memory; ConfigError when it exceeds the memory cgroup this process runs in."""
    need = stage_memory(read_model_facts(model), start, end, shape)
    limit = own_memory_limit()
    if limit is not None and need.total > limit:
        raise ConfigError(f"{stage_id} (layers {start}-{end} of {model.name}) needs about {need.describe()}, but its"
                          f" memory cgroup allows {limit / MIB:.0f} MiB: split the model further or over hosts with more"
                          " memory (skippy plan)")
    return need
