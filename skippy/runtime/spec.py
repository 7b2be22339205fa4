"""What a stage runtime loads: `RuntimeSpec` (from a StageConfig) and the GGUF artifact it resolves to.

`runtime-slice` slices the full GGUF (cached on disk), `artifact-slice` loads a `skippy slice`
output; either way the full model's identity is checked against `source_model_bytes` /
`source_model_sha256` when the config gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skippy.config import StageConfig
from skippy.runtime.errors import ModelError
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.llama_model import ModelLoadParams
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import Progress, check_range, ensure_slice, file_digest, read_model_info


@dataclass(frozen=True)
class RuntimeSpec:
    """What a runtime loads; mirrors the StageConfig fields it needs."""

    model_path: str | Path | None
    layer_start: int
    layer_end: int
    ctx_size: int = 512  # 0: the model's trained context, bounded by memory (skippy.runtime.context_size)
    lane_count: int = 4
    kv_pool_cells: int = 0  # the cells every lane shares; 0: the default (skippy.runtime.context_size)
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_threads: int | None = None
    n_outputs_max: int | None = None  # final stage: logit rows per decode (default 8 per lane)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn_type: str = "auto"
    load_mode: str = "runtime-slice"
    load: ModelLoadParams = ModelLoadParams()
    kv_offload: bool | None = None
    op_offload: bool | None = None
    source_sha256: str | None = None  # the full model's expected digest (checked at load)
    source_bytes: int | None = None  # the full model's expected size (checked at load)
    prefix_entries: int = 0  # prefix cache entries (kv_cache.max_entries); 0 = no prefix cache
    prefix_max_bytes: int = 0  # their KV bytes at most (kv_cache.max_bytes); 0 = the pool's
    deterministic: bool = False  # a row's result independent of its batch (skippy.runtime.lane_contexts)
    mtp: str = "disabled"  # final stage: "integrated" (the slice's NextN block) | "external" | "disabled"
    mtp_draft_model: str | Path | None = None  # "external": the MTP-only GGUF (skippy.runtime.mtp)

    @classmethod
    def from_stage_config(cls, config: StageConfig) -> RuntimeSpec:
        """The config's fields (n_threads unset: all cores; stages sharing a host take turns, see driver)."""
        device = config.selected_device.backend_device if config.selected_device is not None else None
        load = ModelLoadParams(
            n_gpu_layers=config.n_gpu_layers, main_gpu=config.main_gpu, split_mode=str(config.split_mode),
            device=device, mmap=config.mmap, mlock=config.mlock, direct_io=config.direct_io, repack=config.repack,
            no_host=config.no_host_buffer, check_tensors=config.check_tensors,
        )
        return cls(
            model_path=config.model_source,
            layer_start=config.layer_start,
            layer_end=config.layer_end,
            ctx_size=config.ctx_size,
            lane_count=config.lane_count,
            kv_pool_cells=config.kv_pool_cells,
            n_batch=config.n_batch,
            n_ubatch=config.n_ubatch,
            n_threads=config.n_threads,
            cache_type_k=str(config.cache_type_k),
            cache_type_v=str(config.cache_type_v),
            flash_attn_type=str(config.flash_attn_type),
            load_mode=str(config.load_mode),
            load=load,
            kv_offload=config.kv_offload,
            op_offload=config.op_offload,
            source_sha256=config.source_model_sha256,
            source_bytes=config.source_model_bytes,
            prefix_entries=config.kv_cache.max_entries if config.kv_cache and config.kv_cache.should_record else 0,
            prefix_max_bytes=config.kv_cache.max_bytes if config.kv_cache else 0,
            deterministic=config.deterministic,
        )


@dataclass(frozen=True)
class Artifact:
    load_path: Path
    digest: str
    n_layer: int  # layers of the full model
    architecture: str


def check_source(path: Path, spec: RuntimeSpec, digest: str | None = None) -> None:
    """The full model must be the one the config names (source_model_bytes / source_model_sha256)."""
    if spec.source_bytes is not None and digest is None and path.stat().st_size != spec.source_bytes:
        raise ModelError(f"{path}: {path.stat().st_size} bytes, but source_model_bytes is {spec.source_bytes}")
    if spec.source_sha256 is not None:
        have = digest or file_digest(path)
        if have.lower() != spec.source_sha256.lower():
            raise ModelError(f"{path}: sha256 {have}, but source_model_sha256 is {spec.source_sha256}")


def _artifact_slice(path: Path, layer_start: int, layer_end: int) -> Artifact:
    gguf = GGUFFile(path)
    meta = {k: gguf.get(k) for k in gguf.kv if k.startswith("skippy.slice.")}
    gguf.close()
    if "skippy.slice.layer_start" not in meta:
        raise ModelError(f"{path}: not a slice written by `skippy slice` (load_mode artifact-slice needs one)")
    have = (meta["skippy.slice.layer_start"], meta["skippy.slice.layer_end"])
    if have != (layer_start, layer_end):
        raise ModelError(f"{path}: slice holds layers [{have[0]}, {have[1]}), config asks for [{layer_start}, {layer_end})")
    n_layer = meta["skippy.slice.source_n_layer"]
    assert isinstance(n_layer, int), n_layer
    return Artifact(path, str(meta["skippy.slice.source_digest"]), n_layer, read_model_info(path).architecture)


def _runtime_slice(path: Path, layer_start: int, layer_end: int, progress: Progress | None) -> Artifact:
    info = read_model_info(path)
    check_range(info, layer_start, layer_end)
    if (layer_start, layer_end) == (0, info.n_layer):
        return Artifact(path, file_digest(path), info.n_layer, info.architecture)  # the whole model: load it as is
    final = layer_end == info.n_layer
    sliced = ensure_slice(path, layer_start, layer_end, final=final, progress=progress)
    return Artifact(sliced, file_digest(path), info.n_layer, info.architecture)


def resolve_artifact(spec: RuntimeSpec, progress: Progress | None = None) -> Artifact:
    """The GGUF to load for `spec`, checked against the model identity the config names."""
    if spec.load_mode not in ("runtime-slice", "artifact-slice"):
        raise ModelError(f"unknown load_mode {spec.load_mode!r} (runtime-slice | artifact-slice)")
    source = resolve_model_path(spec.model_path)
    if spec.load_mode == "artifact-slice":
        artifact = _artifact_slice(source, spec.layer_start, spec.layer_end)
        check_source(source, spec, artifact.digest)
        return artifact
    check_source(source, spec)
    return _runtime_slice(source, spec.layer_start, spec.layer_end, progress)
