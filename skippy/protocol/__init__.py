"""The wire: every message between skippy processes and its one encoding.

A message is a ZeroMQ multipart.  Frame 0 is a msgpack map
``{"k": kind, "v": PROTOCOL_VERSION, **fields}``; a ``batch`` may add frame 1,
its activations ``[n_rows, n_embd]`` (the windows' rows, concatenated) packed as
its header's ``wire_dtype`` says: raw little-endian float32 in C order (``f32``,
the default), float16 (``f16``) or per-row int8 with a float32 scale (``q8``);
see :mod:`skippy.protocol.activations`.  A receiver always gets float32 back.

The messages are frozen msgspec Structs (:mod:`skippy.protocol.messages`), their
fields' types carrying the value rules; :mod:`skippy.protocol.codec` encodes and
decodes a header with msgspec in one call, checks the few rules across fields
in Python, and names the field of anything it refuses.  :func:`decode`
validates everything it returns and raises only :class:`ProtocolError`, so a
stage can answer a bad peer and keep serving.  Every field is always written;
a missing field with a default takes it (``v`` is always required) and unknown header keys are ignored (an
added field a peer may safely miss needs no version bump), any other change
bumps ``PROTOCOL_VERSION``.  ``wire_dtype`` is such an added field: a header
without it means f32, and a receiver that predates it refuses an f16 or q8
frame by its size (it expects ``4 * n_embd`` bytes per row), never misreads it.

- `base.py`: the common ground: `PROTOCOL_VERSION` and its history, size limits, the base every message derives from.
- `kinds.py`: the vocabularies (error codes and their HTTP statuses, finish reasons, message kinds, dtypes)
  and the value rules fields share.
- `messages.py`: every stage-to-stage message type (and all of them re-exported); `requests.py`: the client
  ones (Submit, Cancel, TokenEvents, Status); `stats.py`: a finished request's numbers on its final event.
- `codec.py`: `encode` / `decode` of a header frame plus a batch's activations; `activations.py`: how those
  travel (f32, f16, q8); `refusals.py`: a refused header explained, with the rule, the field and the value.
"""

from skippy.protocol.codec import (
    MAX_HEADER_BYTES,
    MAX_ROWS,
    MAX_SESSIONS_PER_MESSAGE,
    MAX_WINDOWS,
    PROTOCOL_VERSION,
    decode,
    encode,
)
from skippy.protocol.messages import (
    Batch,
    CacheCaps,
    Cancel,
    ConfigureSession,
    Credit,
    ErrorCode,
    ErrorReport,
    EventBatch,
    FinishReason,
    Heartbeat,
    Hello,
    KeptPrefix,
    Message,
    MessageKind,
    Predictions,
    PrefixRef,
    PromptProgress,
    ProtocolError,
    Ready,
    ReleaseSessions,
    ResumePoint,
    SessionPrediction,
    SetWire,
    StageIdentity,
    StagePrefillRate,
    StageTiming,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
    TokenLogprob,
    Window,
    WireDtype,
    WireVerdict,
)
from skippy.protocol.requests import event_message, events_of

__all__ = [
    "MAX_HEADER_BYTES", "MAX_ROWS", "MAX_SESSIONS_PER_MESSAGE", "MAX_WINDOWS", "PROTOCOL_VERSION", "Batch", "CacheCaps",
    "Cancel", "ConfigureSession", "Credit", "ErrorCode", "ErrorReport", "EventBatch", "FinishReason", "Heartbeat", "Hello",
    "KeptPrefix", "Message", "MessageKind", "Predictions", "PrefixRef", "PromptProgress", "ProtocolError", "Ready",
    "ReleaseSessions", "ResumePoint", "SessionPrediction", "SetWire", "StageIdentity", "StagePrefillRate", "StageTiming",
    "Status", "StatusQuery", "Submit", "TokenEvents", "TokenLogprob", "Window", "WireDtype", "WireVerdict", "decode", "encode",
    "event_message", "events_of",
]
