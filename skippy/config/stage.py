"""Stage configuration: the JSON config one stage process starts from.

``StageConfig`` accepts every field of a stage config JSON (docs/stage-config.md says
what each does); ``StageConfig.check_against`` enforces that a stage's config agrees with its entry in
the pipeline's ``StageTopology`` (skippy.config.topology). It loads from JSON with errors that name the
file and the field, and dumps back to the same JSON.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from skippy.config.errors import ConfigError
from skippy.config.kv_cache import KvCacheConfig, KvCacheMode, KvCachePayload
from skippy.config.llama_options import (
    SelectedDevice,
    SplitMode,
    check_deterministic,
    check_llama_fields,
    check_unsupported_fields,
)
from skippy.config.schema import ConfigModel, SignedInt, check, show
from skippy.config.topology import (
    LoadMode,
    StageTopology,
    check_layer_range,
    normalize_endpoint,
    require_text,
)

__all__ = [
    "FlashAttnType",
    "KvCacheConfig",
    "KvCacheMode",
    "KvCachePayload",
    "KvCacheType",
    "PeerConfig",
    "SelectedDevice",
    "SplitMode",
    "StageConfig",
]


class FlashAttnType(enum.StrEnum):
    AUTO = "auto"
    ENABLED = "enabled"
    DISABLED = "disabled"


class KvCacheType(enum.StrEnum):
    """llama.cpp KV cache element types (``cache_type_k`` / ``cache_type_v``)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    Q4_1 = "q4_1"
    IQ4_NL = "iq4_nl"
    Q5_0 = "q5_0"
    Q5_1 = "q5_1"


@dataclass(frozen=True)
class PeerConfig(ConfigModel):
    """A neighbouring stage: its id, index and the endpoint to connect to."""

    stage_id: str
    stage_index: int
    endpoint: str

    def _check(self) -> None:
        require_text(self, "stage_id")
        normalize_endpoint(self, "endpoint", bind=False)


@dataclass(frozen=True, kw_only=True)
class StageConfig(ConfigModel):
    """The JSON config one stage process starts from, every field of it.

    What each field does is in docs/stage-config.md; `None` means llama.cpp's default.
    """

    run_id: str
    topology_id: str
    model_id: str
    package_ref: str | None = None  # metadata: the layer package the stage came from
    manifest_sha256: str | None = None  # metadata: that package's manifest digest
    source_model_path: str | None = None  # the full GGUF; used when model_path is unset
    source_model_sha256: str | None = None  # checked against the full GGUF at load
    source_model_bytes: int | None = None  # checked against the full GGUF's size at load
    materialized_path: str | None = None  # metadata: where the stage's files were materialised
    materialized_pinned: bool = False  # metadata
    model_path: str | None = None  # None or "default" = the packaged default model
    projector_path: str | None = None  # multimodal: refused
    stage_id: str
    stage_index: int
    layer_start: int
    layer_end: int
    ctx_size: int = 0  # positions a session may hold; 0 = the model's trained context, bounded by memory
    lane_count: int = 4
    kv_pool_cells: int = 0  # skippy's own: KV cells every lane shares; 0 = a context per lane, bounded by memory
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_threads: int | None = None  # skippy's own: llama.cpp threads (default: every core)
    n_gpu_layers: SignedInt = SignedInt(0)  # layers offloaded to GPU; -1 = all
    mmap: bool | None = None
    mlock: bool = False
    repack: bool | None = None  # llama.cpp's extra buffer types (weight repacking); None = on
    op_offload: bool | None = None
    no_host_buffer: bool = False
    check_tensors: bool = False
    direct_io: bool = False
    main_gpu: SignedInt | None = None
    split_mode: SplitMode = SplitMode.AUTO
    cache_type_k: KvCacheType = KvCacheType.F16
    cache_type_v: KvCacheType = KvCacheType.F16
    flash_attn_type: FlashAttnType = FlashAttnType.AUTO
    kv_offload: bool | None = None
    kv_unified: bool | None = None  # must stay true (the default here)
    swa_full: bool | None = None  # must stay true (the default here)
    cache_idle_slots: bool | None = None
    filter_tensors_on_load: bool = False  # skippy always loads only owned tensors (a slice GGUF)
    resident_tensor_names: tuple[str, ...] = ()
    selected_device: SelectedDevice | None = None
    kv_cache: KvCacheConfig | None = None
    native_mtp_enabled: bool = True
    load_mode: LoadMode
    bind_addr: str
    upstream: PeerConfig | None = None
    downstream: PeerConfig | None = None
    deterministic: bool = False  # skippy's own: a row's result independent of its batch (docs/deterministic.md)

    def _check(self) -> None:
        require_text(self, "run_id", "topology_id", "model_id", "model_path", "source_model_path", "stage_id")
        check_layer_range(self.layer_start, self.layer_end)
        for name in ("lane_count", "n_batch", "n_ubatch", "n_threads"):
            value = getattr(self, name)
            check(value is None or value > 0, name, f"must be > 0, got {value}")
        if self.ctx_size and self.kv_pool_cells:
            check(self.kv_pool_cells >= self.ctx_size, "kv_pool_cells",
                  f"must hold at least one context (ctx_size {self.ctx_size}), got {self.kv_pool_cells}")
        if self.n_batch is not None and self.n_ubatch is not None:
            check(
                self.n_ubatch <= self.n_batch,
                "n_ubatch",
                f"must be <= n_batch ({self.n_batch}), got {self.n_ubatch}",
            )
        check(
            self.load_mode is not LoadMode.LAYER_PACKAGE,
            "load_mode",
            "'layer-package' is not supported (use 'runtime-slice' on a GGUF or 'artifact-slice' on a"
            " `skippy slice` output)",
        )
        check_llama_fields(self)
        if self.deterministic:
            check_deterministic(self)
        check_unsupported_fields(self)
        normalize_endpoint(self, "bind_addr", bind=True)
        index = self.stage_index
        if self.upstream is not None:
            up = self.upstream.stage_index
            check(up < index, "upstream.stage_index", f"must be < stage_index ({index}), got {up}")
        if self.downstream is not None:
            down = self.downstream.stage_index
            reason = f"must be > stage_index ({index}), got {down}"
            check(down > index, "downstream.stage_index", reason)

    @property
    def model_source(self) -> str | None:
        """The GGUF this stage loads from: model_path, else source_model_path, else the default."""
        return self.model_path if self.model_path is not None else self.source_model_path

    @property
    def is_first(self) -> bool:
        """Stage 0: owns the embeddings and the request front."""
        return self.stage_index == 0

    @property
    def is_final(self) -> bool:
        """No downstream: owns the output head and samples tokens."""
        return self.downstream is None

    def check_against(self, topology: StageTopology, source: str = "<config>") -> None:
        """Fail unless this config matches its entry in ``topology``."""
        for name in ("topology_id", "model_id"):
            mine, theirs = getattr(self, name), getattr(topology, name)
            if mine != theirs:
                raise ConfigError(
                    f"{source}: field '{name}' is {show(mine)} but the topology has {show(theirs)}"
                )
        try:
            entry = topology.entry(self.stage_id)
        except KeyError:
            raise ConfigError(
                f"{source}: field 'stage_id' {show(self.stage_id)} is not in topology"
                f" {show(topology.topology_id)}"
            ) from None
        for name in ("stage_index", "layer_start", "layer_end", "load_mode"):
            mine, theirs = getattr(self, name), getattr(entry, name)
            if mine != theirs:
                raise ConfigError(
                    f"{source}: field '{name}' is {show(mine)} but topology stage"
                    f" {show(entry.stage_id)} has {show(theirs)}"
                )
