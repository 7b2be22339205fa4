"""Command-line flags of a stage server and typed reading of their values.

``add_serving_arguments`` declares the stage server's
flags.  Every flag defaults to None so the resolver can tell "unset"
from "set to the default" and derive defaults from the stage config; values
are left as strings and converted by :class:`FlagReader`, so any bad value
becomes a one-line ConfigError naming the flag (``--flag must be ..., got X``).

Each flag has an :class:`Owner`: the process that acts on it.  Launchers
(``skippy up``) declare the flags of the owners they serve and hand each
given flag to its owner with ``FlagReader.argv``.
"""

from __future__ import annotations

import argparse
import enum
import math
import os
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from skippy.config.errors import ConfigError

__all__ = ["FlagReader", "Owner", "add_serving_arguments", "flag_owner"]

E = TypeVar("E", bound=enum.Enum)


class Owner(enum.Enum):
    """Which process acts on a flag."""

    STAGE_FILES = "stage-files"  # per-stage files and sockets, set by launchers
    EVERY_STAGE = "every-stage"  # each stage process
    STAGE0 = "stage0"  # stage 0's driver: prefill chunking, speculative decoding
    FRONT = "front"  # --openai-bind-addr: stage 0 starts broker + adapter itself
    BROKER = "broker"  # generation admission
    ADAPTER = "adapter"  # the OpenAI HTTP adapter


_S, _E, _0, _F, _B, _A = Owner
# (flag, metavar, help, owner) for value flags; metavar None marks an on/off switch.
_FLAGS: tuple[tuple[str, str | None, str, Owner], ...] = (
    ("--config", "PATH", "StageConfig JSON file (required)", _S),
    ("--topology", "PATH", "StageTopology JSON file; the config is checked against it", _S),
    ("--bind-addr", "ENDPOINT", "stage socket endpoint (default: the config's bind_addr)", _S),
    ("--link-secret-key", "PATH", "this stage's CURVE secret key (default: <keys_dir>/<stage_id>.key_secret"
     " of a topology with keys)", _S),
    ("--insecure-links", None, "allow plain (unauthenticated) stage links on non-loopback addresses (logged)", _E),
    ("--max-inflight", "N", "in-flight messages per connection (default 4, clamped to lane_count)", _E),
    ("--reply-credit-limit", "N", "deferred prefill ACK window (default max_inflight - 1)", _E),
    ("--async-prefill-forward", None, "forward prefill activations asynchronously (default)", _E),
    ("--no-async-prefill-forward", None, "forward prefill activations synchronously", _E),
    ("--downstream-wire-delay-ms", "MS", "emulated propagation delay downstream (default 0)", _E),
    ("--downstream-wire-mbps", "MBPS", "emulated downstream bandwidth (default unlimited)", _E),
    ("--downstream-connect-timeout-secs", "SECS", "wait for the downstream stage (default 60)", _E),
    ("--activation-wire-dtype", "DTYPE",
     "activations to the next stage: f32 (default, exact) | f16 | q8 | auto (the smallest that stage 0 certifies)", _E),
    ("--no-activation-wire-certify", None, "serve an f16/q8 wire without stage 0's startup certification", _0),
    ("--telemetry-level", "LEVEL", "off | summary | debug (default summary)", _E),
    ("--deterministic", None, "a request's output independent of its batch: concurrency, speculation, prefix cache"
     " placement (one llama.cpp context per lane; docs/deterministic.md)", _E),
    ("--cpu-affinity", "CPUS", "pin this stage to CPUs, e.g. 0 or 0-3 or 0,2 (default: not pinned)", _E),
    ("--stage-cpus", "LIST", "pin stage i to the i-th CPU set, e.g. 0,1 or 0-1,2+3 (default: not pinned)", _E),
    ("--telemetry-queue-capacity", "N", "telemetry events buffered for export; more are dropped and counted (default 1024)",
     _E),
    ("--metrics-otlp-grpc", "URL", "export spans to this OTLP gRPC collector, e.g. http://127.0.0.1:4317", _E),
    ("--metrics-bind", "HOST", "where this process's /metrics listens (default 127.0.0.1); behind"
     " $SKIPPY_OPENAI_API_KEY when set", _E),
    ("--openai-bind-addr", "HOST:PORT", "serve the OpenAI API here (stage 0 only)", _F),
    ("--openai-model-id", "ID", "served model id (default: the config's model_id)", _A),
    ("--openai-default-max-tokens", "N", "max_tokens when a request omits it, within the context (default 4096)", _A),
    ("--openai-sse-ping-interval", "SECS", "an SSE comment ping after this long without an event in a stream, e.g."
     " while a long prompt prefills (default 30, as llama-server; 0: none)", _A),
    ("--openai-api-key", "KEY", "Bearer key the HTTP API requires, visible on the command line (default:"
     " $SKIPPY_OPENAI_API_KEY; unset: open)", _A),
    ("--openai-api-key-file", "PATH", "file holding the Bearer key (instead of --openai-api-key)", _A),
    ("--openai-cors-origins", "LIST", "origins browsers may call the HTTP API from, comma separated"
     " scheme://host[:port], or * for any (default: none, no CORS headers)", _A),
    ("--openai-strict-request-fields", None, "a request field the HTTP API does not know is a 400 (default: ignored,"
     " logged once per name and counted on /metrics)", _A),
    ("--openai-http-head-timeout-s", "SECS", "a request head must arrive within this, whole (default 30)", _A),
    ("--openai-http-body-timeout-s", "SECS", "a request body must arrive within this, whole (default 60)", _A),
    ("--openai-http-max-connections", "N", "open HTTP connections at most; one more gets a 503 (default 512)", _A),
    ("--openai-generation-concurrency", "N", "generation permits per pipeline (default lane_count)", _B),
    ("--openai-adaptive-generation-concurrency", None, "adapt permits to measured throughput", _B),
    ("--openai-adaptive-generation-min-concurrency", "N", "initial adaptive permits (default 1)", _B),
    ("--openai-generation-queue-capacity", "N", "waiting requests (default clamp(8*N, 16, 256))", _B),
    ("--openai-generation-admission-timeout-secs", "SECS", "queue wait limit; 0 = none (default)", _B),
    ("--openai-prefill-chunk-size", "N", "fixed prefill chunk size (default 256)", _0),
    ("--openai-prefill-chunk-policy", "POLICY", "fixed | schedule | adaptive-ramp (default)", _0),
    ("--openai-prefill-chunk-schedule", "LIST", "chunk sizes for 'schedule', e.g. 128,256,384", _0),
    ("--openai-prefill-adaptive-start", "N", "adaptive-ramp first chunk size (default 128; with one micro-batch in flight, stages"
     " sharing cores or one stage: the ramp's max unless a chunk flag is given)", _0),
    ("--openai-prefill-adaptive-step", "N", "adaptive-ramp step (default 128)", _0),
    ("--openai-prefill-adaptive-max", "N", "adaptive-ramp largest chunk (default 384)", _0),
    ("--openai-prefill-adaptive-target-ms", "MS", "adaptive-ramp chunk time target (default 100)", _0),
    ("--openai-resume-timeout-s", "SECS", "a request paused by a later stage's death fails if the stage is not"
     " back within this (default 60)", _0),
    ("--openai-speculative-config", "PATH", "SpeculativeDecodeConfig JSON file (default: the suffix proposer"
     " under the per-session speculation policy)", _0),
    ("--no-speculative", None, "decode plainly: no speculative decoding (default: on, the per-session policy)", _0),
    ("--openai-draft-model-path", "PATH", "standalone draft model GGUF (same vocabulary as the target)", _0),
    ("--openai-speculative-window", "N", "draft tokens per verify window (default: the plan's max, or 4)", _0),
    ("--openai-adaptive-speculative-window", None, "adapt the window per session (cost model by default)", _0),
    ("--openai-adaptive-speculative-window-mode", "MODE", "cost (default) | simple (grow/shrink rule)", _0),
    ("--openai-speculative-global-tokens", "N", "tokens of recent sessions the suffix proposer drafts from across"
     " requests (default 65536; 0 = only the request's own)", _0),
    ("--openai-draft-n-gpu-layers", "N", "draft model GPU layers (default: the config's n_gpu_layers)", _0),
    ("--openai-native-mtp-draft-model-path", "PATH", "External native MTP: an MTP-only GGUF the final stage drafts"
     " from (docs/mtp.md)", _0),
)


def add_serving_arguments(
    parser: argparse.ArgumentParser, owners: Collection[Owner] = tuple(Owner)
) -> None:
    """Add the stage-server flags of ``owners`` (default: all) to ``parser``; all default to None."""
    for flag, metavar, help_text, owner in _FLAGS:
        if owner not in owners:
            continue
        if metavar is None:
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            required = flag == "--config"
            parser.add_argument(
                flag, metavar=metavar, default=None, required=required, help=help_text
            )


def flag_owner(flag: str) -> Owner | None:
    """The owner of a stage-server flag (None: not one)."""
    return next((owner for name, _metavar, _help, owner in _FLAGS if name == flag), None)


class FlagReader:
    """Typed access to flag values in a Namespace (strings, or already-typed values)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args

    def raw(self, flag: str) -> Any:
        return getattr(self._args, flag.lstrip("-").replace("-", "_"), None)

    def given(self, flag: str) -> bool:
        return self.raw(flag) is not None

    def argv(self, owners: Collection[Owner]) -> list[str]:
        """The given flags of ``owners``, back as command-line arguments (to hand to their owner)."""
        argv: list[str] = []
        for flag, metavar, _help, owner in _FLAGS:
            if owner not in owners or not self.given(flag):
                continue
            if metavar is not None:
                argv += [flag, str(self.raw(flag))]
            elif self.switch(flag):
                argv.append(flag)
        return argv

    def switch(self, flag: str) -> bool:
        return bool(self.raw(flag))

    def text(self, flag: str, default: str | None = None) -> str | None:
        value = self.raw(flag)
        if value is None:
            return default
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{flag} must be a non-empty string, got {value!r}")
        return value.strip()

    def integer(self, flag: str, default: int, *, minimum: int | None = 1) -> int:
        """An integer flag; ``minimum`` None allows any (signed) value."""
        value = self.raw(flag)
        if value is None:
            return default
        if isinstance(value, str):
            try:
                value = int(value.strip(), 10)
            except ValueError:
                raise ConfigError(f"{flag} must be an integer, got '{value}'") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{flag} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            bound = "> 0" if minimum == 1 else f">= {minimum}"
            raise ConfigError(f"{flag} must be {bound}, got {value}")
        return value

    def endpoint(self, flag: str, normalize: Callable[[str], str]) -> str | None:
        """A text flag checked and normalised by `normalize` (whose ValueError completes `--flag ...`)."""
        value = self.text(flag)
        if value is None:
            return None
        try:
            return normalize(value)
        except ValueError as error:
            raise ConfigError(f"{flag} {error}") from None

    def optional_integer(self, flag: str, *, minimum: int | None = 1) -> int | None:
        """An integer flag, or None when it is not given."""
        return self.integer(flag, 0, minimum=minimum) if self.given(flag) else None

    def number(self, flag: str, default: float, *, positive: bool = False) -> float:
        value = self.raw(flag)
        if value is None:
            return default
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise ConfigError(f"{flag} must be a number, got {value!r}") from None
        if not math.isfinite(number) or number < 0 or (positive and number == 0):
            bound = "> 0" if positive else ">= 0"
            raise ConfigError(f"{flag} must be finite and {bound}, got {value}")
        return number

    def choice(
        self, flag: str, enum_type: type[E], default: E, aliases: dict[str, E] | None = None
    ) -> E:
        value = self.raw(flag)
        if value is None:
            return default
        if isinstance(value, enum_type):
            return value
        key = str(value).strip()
        if aliases and key in aliases:
            return aliases[key]
        try:
            return enum_type(key)
        except ValueError:
            names = " | ".join(str(member.value) for member in enum_type)
            raise ConfigError(f"{flag} must be one of {names}, got '{value}'") from None

    def int_list(self, flag: str) -> tuple[int, ...] | None:
        value = self.raw(flag)
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            parts = [str(item) for item in value]
        else:
            parts = str(value).split(",")
        try:
            sizes = tuple(int(part.strip(), 10) for part in parts)
        except ValueError:
            sizes = ()
        if not sizes or any(size <= 0 for size in sizes):
            raise ConfigError(
                f"{flag} must be a comma-separated list of positive integers, got '{value}'"
            )
        return sizes
