"""Typed configuration for skippy: stage configs, topologies, plans, serving options.

The lowest layer of the package (imports nothing else from skippy).  Every
type loads from JSON or CLI flags with errors that name the file and field
(or the flag), and serialises back to the same JSON.
"""

from skippy.config.errors import ConfigError, FieldError
from skippy.config.serving import (
    AdmissionOptions,
    MtpSource,
    OpenAIOptions,
    PrefillChunkOptions,
    PrefillChunkPolicy,
    ServingOptions,
    TelemetryLevel,
    add_serving_arguments,
    default_queue_capacity,
    parse_serving_args,
    resolve_mtp_source,
    resolve_serving_options,
)
from skippy.config.speculative import (
    NativeMtpConfig,
    NgramConfig,
    NgramExtensionConfig,
    NgramKind,
    SpeculativeDecodeConfig,
    VerifyWindowConfig,
)
from skippy.config.stage import (
    FlashAttnType,
    KvCacheConfig,
    KvCacheMode,
    KvCachePayload,
    KvCacheType,
    LoadMode,
    PeerConfig,
    SelectedDevice,
    SplitMode,
    StageConfig,
    StageTopology,
    StageTopologyEntry,
)
from skippy.config.wire import WireCondition

__all__ = [
    "AdmissionOptions",
    "ConfigError",
    "FieldError",
    "FlashAttnType",
    "KvCacheConfig",
    "KvCacheMode",
    "KvCachePayload",
    "KvCacheType",
    "LoadMode",
    "MtpSource",
    "NativeMtpConfig",
    "NgramConfig",
    "NgramExtensionConfig",
    "NgramKind",
    "OpenAIOptions",
    "PeerConfig",
    "PrefillChunkOptions",
    "PrefillChunkPolicy",
    "SelectedDevice",
    "ServingOptions",
    "SpeculativeDecodeConfig",
    "SplitMode",
    "StageConfig",
    "StageTopology",
    "StageTopologyEntry",
    "TelemetryLevel",
    "VerifyWindowConfig",
    "WireCondition",
    "add_serving_arguments",
    "default_queue_capacity",
    "parse_serving_args",
    "resolve_mtp_source",
    "resolve_serving_options",
]
