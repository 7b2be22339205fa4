"""Typed configuration for skippy: stage configs, topologies, plans, serving options.

Below everything that runs (imports only the wire's vocabularies, skippy.protocol.kinds).  Every
type loads from JSON or CLI flags with errors that name the file and field
(or the flag), and serialises back to the same JSON.

- `schema.py`: JSON <-> frozen dataclass conversion every config type derives from (`ConfigModel`).
- `errors.py`: `ConfigError`, one line naming the file and field or the flag; `FieldError` inside validation.
- `stage.py`: `StageConfig`, the JSON one stage process starts from (docs/stage-config.md), with
  `llama_options.py` (its llama.cpp load and context knobs and their rules) and `kv_cache.py` (its prefix
  cache settings).
- `topology.py`: `StageTopology`, every stage of one pipeline in order; `link_keys.py`: the CURVE public keys
  it names and where secret keys live.
- `endpoint.py`: endpoint strings (ZeroMQ, host:port, OTLP URLs), normalised and checked.
- `wire.py`: `WireCondition`, a link's emulated delay and rate and its activation encoding.
- `speculative.py`: `SpeculativeDecodeConfig`, the speculative-decoding plan JSON.
- `serving_args.py`: a stage server's command-line flags and `FlagReader`, typed reading of their values;
  `serving.py`: those flags resolved against the stage config into `ServingOptions`.
- `generation.py`: stage 0's generation options: prefill chunking and speculative decoding.
- `admission.py`: the broker's admission options (the `--openai-generation-*` flags), written back as flags
  for a broker started as a child.
- `context.py`: the context-window rule for a prompt, asked by adapter, broker and stage 0 alike.
- `http_limits.py`: the adapter's HTTP limits (sizes, deadlines, connections).
- `api_key.py`: the HTTP API key, from the environment, a file or a flag.
- `cpu_sets.py`: `--cpu-affinity` and `--stage-cpus`, parsed and checked.
- `ssh_target.py`: how a hosts file's host is reached over SSH (its `ssh` entry), checked.
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
