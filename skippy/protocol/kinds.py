"""The wire's vocabularies: error codes, finish reasons, message kinds, activation dtypes (all StrEnums,
so they travel as their string values and are validated on decode)."""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Why something failed, as it travels in ErrorReport.code and TokenEvents.code."""

    # a message no peer should have sent (ProtocolError.code)
    MALFORMED = "malformed"
    VERSION = "version"
    UNKNOWN_KIND = "unknown_kind"
    N_EMBD = "n_embd"
    TOO_LARGE = "too_large"
    # a stage's report to its upstream or to stage 0
    HANDSHAKE = "handshake"
    STAGE_STOPPED = "stage_stopped"
    BATCH_FAILED = "batch_failed"
    SESSION_CONTROL = "session_control"
    # a request's outcome, as a client sees it
    QUEUE_FULL = "queue_full"  # HTTP 429
    ADMISSION_TIMEOUT = "admission_timeout"  # HTTP 429
    UNAVAILABLE = "unavailable"  # HTTP 503
    BAD_REQUEST = "bad_request"  # HTTP 400
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # HTTP 400
    PIPELINE_FAILED = "pipeline_failed"  # HTTP 502


class FinishReason(enum.StrEnum):
    """How a request ended (the last TokenEvents of a request carries one)."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


class MessageKind(enum.StrEnum):
    """The `k` of a message header: which message type follows."""

    HELLO = "hello"
    READY = "ready"
    BATCH = "batch"
    CONFIGURE = "configure"
    RELEASE = "release"
    CREDIT = "credit"
    PREDICTIONS = "predictions"
    ERROR = "error"
    HEARTBEAT = "heartbeat"
    WIRE = "wire"
    SUBMIT = "submit"
    CANCEL = "cancel"
    TOKENS = "tokens"
    STATUS_QUERY = "status_query"
    STATUS = "status"


class WireDtype(enum.StrEnum):
    """How a batch's activations travel (``Batch.wire_dtype``); see `skippy.protocol.activations`."""

    F32 = "f32"  # float32, bitwise exact
    F16 = "f16"  # float16, saturating at +-65504
    Q8 = "q8"  # per-row absmax int8 plus a float32 scale per row
