"""Typed configuration for skippy: stage configs, topologies, plans, serving options.

Below everything that runs (imports only the wire's vocabularies, skippy.protocol.kinds).  Every
type loads from JSON or CLI flags with errors that name the file and field
(or the flag), and serialises back to the same JSON.
"""

from skippy.config.admission import resolve_admission
from skippy.config.context import PromptLengthError, prompt_length_error
from skippy.config.errors import ConfigError, FieldError
from skippy.config.serving import (
    AdmissionOptions,
    MtpSource,
    OpenAIOptions,
    PrefillChunkOptions,
    PrefillChunkPolicy,
    ServingOptions,
    SpeculativeOptions,
    TelemetryLevel,
    add_serving_arguments,
    default_queue_capacity,
    parse_serving_args,
    refuse_unsupported,
    resolve_mtp_source,
    resolve_serving_options,
    unsupported_options,
)
from skippy.config.serving_args import FlagReader, Owner
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
    PeerConfig,
    SelectedDevice,
    SplitMode,
    StageConfig,
)
from skippy.config.topology import LoadMode, StageTopology, StageTopologyEntry
from skippy.config.wire import WireChoice, WireCondition

__all__ = [
    "AdmissionOptions",
    "ConfigError",
    "FieldError",
    "FlagReader",
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
    "Owner",
    "PeerConfig",
    "PrefillChunkOptions",
    "PrefillChunkPolicy",
    "PromptLengthError",
    "SelectedDevice",
    "ServingOptions",
    "SpeculativeDecodeConfig",
    "SpeculativeOptions",
    "SplitMode",
    "StageConfig",
    "StageTopology",
    "StageTopologyEntry",
    "TelemetryLevel",
    "VerifyWindowConfig",
    "WireChoice",
    "WireCondition",
    "add_serving_arguments",
    "default_queue_capacity",
    "parse_serving_args",
    "prompt_length_error",
    "refuse_unsupported",
    "resolve_admission",
    "resolve_mtp_source",
    "resolve_serving_options",
    "unsupported_options",
]
