"""The wire: every message between skippy processes and its one encoding.

A message is a ZeroMQ multipart.  Frame 0 is a msgpack map
``{"v": PROTOCOL_VERSION, "k": kind, **fields}``; a ``batch`` may add frame 1,
the raw little-endian float32 activations ``[n_rows, n_embd]`` in C order (the
windows' rows, concatenated).  :func:`decode` validates everything it returns
and raises only :class:`ProtocolError`, so a stage can answer a bad peer and
keep serving.  Every field is always written; unknown header keys are ignored
(an added field a peer may safely miss needs no version bump), any other change
bumps ``PROTOCOL_VERSION``.
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
    Cancel,
    ConfigureSession,
    Credit,
    ErrorCode,
    ErrorReport,
    FinishReason,
    Heartbeat,
    Hello,
    Message,
    MessageKind,
    Predictions,
    ProtocolError,
    Ready,
    ReleaseSessions,
    SessionPrediction,
    SetWire,
    StageIdentity,
    StageTiming,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
    TokenLogprob,
    Window,
)

__all__ = [
    "MAX_HEADER_BYTES", "MAX_ROWS", "MAX_SESSIONS_PER_MESSAGE", "MAX_WINDOWS", "PROTOCOL_VERSION", "Batch", "Cancel",
    "ConfigureSession", "Credit", "ErrorCode", "ErrorReport", "FinishReason", "Heartbeat", "Hello", "Message",
    "MessageKind", "Predictions", "ProtocolError",
    "Ready", "ReleaseSessions", "SessionPrediction", "SetWire", "StageIdentity", "StageTiming", "Status",
    "StatusQuery", "Submit", "TokenEvents", "TokenLogprob", "Window", "decode", "encode",
]
