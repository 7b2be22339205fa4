"""The wire's vocabularies: error codes, finish reasons, message kinds, activation dtypes (all StrEnums,
so they travel as their string values and are validated on decode), and the value rules the messages'
fields share (``Annotated`` with a ``msgspec.Meta``: msgspec checks them while it decodes)."""

from __future__ import annotations

import enum
import sys
from typing import Annotated, TypeAlias

import msgspec

U63: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
"""An id or a count: an int >= 0 that fits an int64."""
I31: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
"""A token id or a position: llama.cpp's are int32."""
Finite: TypeAlias = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
"""A finite number (NaN fails both bounds); an int on the wire is read as a float."""


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
    # a request's outcome, as a client sees it (HTTP_STATUS below)
    QUEUE_FULL = "queue_full"
    ADMISSION_TIMEOUT = "admission_timeout"
    UNAVAILABLE = "unavailable"
    BAD_REQUEST = "bad_request"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    PIPELINE_FAILED = "pipeline_failed"
    SLOW_CLIENT = "slow_client"  # the client did not read its events: they overflowed a bounded queue toward it
    # the process holding the request died (stage 0, the broker): the tokens its client has are all there were,
    # and it may resume the request from them (Submit.resume_from) once the pipeline is back (skippy.adapter.resume does)
    PIPELINE_LOST = "pipeline_lost"


# The one ErrorCode -> HTTP status mapping (the adapter answers with it, the broker counts its 429s by it);
# any other code a request ends with is a 502.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.QUEUE_FULL: 429, ErrorCode.ADMISSION_TIMEOUT: 429, ErrorCode.UNAVAILABLE: 503,
    ErrorCode.BAD_REQUEST: 400, ErrorCode.CONTEXT_LENGTH_EXCEEDED: 400, ErrorCode.PIPELINE_FAILED: 502,
    ErrorCode.PIPELINE_LOST: 502,
}


def http_status(code: str) -> int:
    """The HTTP status a request that ended with error `code` answers with."""
    return HTTP_STATUS.get(code, 502)  # type: ignore[call-overload]  # a StrEnum key matches its str


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
    EVENTS = "events"
    STATUS_QUERY = "status_query"
    STATUS = "status"


class WireDtype(enum.StrEnum):
    """How a batch's activations travel (``Batch.wire_dtype``); see `skippy.protocol.activations`."""

    F32 = "f32"  # float32, bitwise exact
    F16 = "f16"  # float16, saturating at +-65504
    Q8 = "q8"  # per-row absmax int8 plus a float32 scale per row
