"""Every message type between skippy processes: small frozen dataclasses, one per kind.

`skippy.protocol.codec` turns them into ZeroMQ multiparts and back; see the package docstring.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

_FRAME = {"frame": True}  # field metadata: travels as frame 1, not in the header


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


class ProtocolError(Exception):
    """An invalid message; ``code`` is one of the first five ErrorCodes."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class StageIdentity:
    """What a stage announces: its layer range ``[layer_start, layer_end)`` of which model."""
    stage_id: str
    stage_index: int
    layer_start: int
    layer_end: int
    model_digest: str
    n_embd: int


@dataclass(frozen=True)
class Hello:
    """Upstream -> downstream at startup; ``reply_endpoint`` is where credits go."""
    sender: StageIdentity
    reply_endpoint: str


@dataclass(frozen=True)
class Ready:
    """Downstream -> upstream: the Hello is accepted."""
    sender: StageIdentity


@dataclass(frozen=True)
class Window:
    """One session's rows in a batch; ``outputs`` are row offsets whose predictions are wanted.

    A verify window carries ``draft``: the tokens proposed after its first row (rows 1..n-1 are
    ``draft``). The final stage samples its rows in order and stops at the first sample that differs
    from the draft, returning accepted + 1 tokens. A *chained* verify window (pipelined behind another
    of its session) also carries ``head``, its first row's input: a guess of the previous window's
    last sample. The final stage verifies it only if that guess came true at ``pos_start``;
    otherwise the window is stale and comes back with no tokens.
    """
    session_id: int
    pos_start: int
    n_tokens: int
    outputs: tuple[int, ...] = ()
    draft: tuple[int, ...] = ()
    head: int | None = None


@dataclass(frozen=True)
class StageTiming:
    """One stage's handling of a batch: wall-clock seconds (time.time()) and durations in ms."""
    stage_id: str
    recv_at: float
    compute_ms: float
    credit_wait_ms: float
    sent_at: float


@dataclass(frozen=True, eq=False)
class Batch:
    """Rows from many sessions; ``hidden`` is float32 ``[n_rows, n_embd]`` (None into stage 0)."""
    batch_id: int
    windows: tuple[Window, ...]
    hidden: np.ndarray | None = field(default=None, metadata=_FRAME)
    timings: tuple[StageTiming, ...] = ()

    @property
    def n_rows(self) -> int:
        return sum(w.n_tokens for w in self.windows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        a, b = self.hidden, other.hidden
        same = a is b or (a is not None and b is not None and np.array_equal(a, b))
        return same and (self.batch_id, self.windows, self.timings) == (other.batch_id, other.windows, other.timings)


@dataclass(frozen=True)
class ConfigureSession:
    """Sampling settings for a session, sent once; ``sampling`` is ``SamplingParams.to_dict()``."""
    session_id: int
    sampling: dict[str, Any]


@dataclass(frozen=True)
class ReleaseSessions:
    """Forget these sessions (KV and sampler state)."""
    session_ids: tuple[int, ...]


@dataclass(frozen=True)
class Credit:
    """Receiver -> sender: batch ``batch_id`` was taken, one more may be sent."""
    batch_id: int
    stage_id: str


@dataclass(frozen=True)
class TokenLogprob:
    """log p(token) under the model's logits, and the `top` most likely (token, logprob) pairs."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SessionPrediction:
    """One token per requested output position of a session's window, in order (+ logprobs if asked)."""
    session_id: int
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Predictions:
    """Final stage -> stage 0: the sampled tokens of a batch."""
    batch_id: int
    results: tuple[SessionPrediction, ...]
    timings: tuple[StageTiming, ...] = ()


@dataclass(frozen=True)
class ErrorReport:
    """A stage could not handle something; ``batch_id``/``session_ids`` say what, when known."""
    code: ErrorCode
    message: str
    stage_id: str
    batch_id: int | None = None
    session_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Heartbeat:
    """Liveness: a PUSH queues silently toward a dead peer, so silence must be noticed."""
    stage_id: str


@dataclass(frozen=True)
class SetWire:
    """Change the wire condition of a running stage's downstream link (scripts/wire-delay)."""
    delay_ms: float
    mbps: float | None = None


@dataclass(frozen=True)
class Submit:
    """Client -> stage 0: generate from prompt token ids; ``sampling`` is ``SamplingParams.to_dict()``."""
    request_id: str
    prompt: tuple[int, ...]
    sampling: dict[str, Any]
    max_tokens: int
    stop_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Cancel:
    """Client -> stage 0: stop a request (its sessions are released on every stage)."""
    request_id: str


@dataclass(frozen=True)
class TokenEvents:
    """Stage 0 / broker -> client: new tokens of a request; ``finish_reason`` set on the last one.

    ``code`` classifies an error (see ErrorCode for the HTTP status each maps to).
    """
    request_id: str
    tokens: tuple[int, ...]
    finish_reason: FinishReason | None = None
    error: str | None = None
    code: ErrorCode | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    stats: tuple[tuple[str, float], ...] = ()  # on the last message: the request's numbers (speculation)


@dataclass(frozen=True)
class StatusQuery:
    """Client -> stage 0: is the pipeline up, and how loaded is it."""
    nonce: int


@dataclass(frozen=True)
class Status:
    """Stage 0 -> client: pipeline readiness and load."""
    nonce: int
    ready: bool
    dead_stage: str | None
    running: int
    waiting: int
    lane_count: int
    ctx_size: int


Message: TypeAlias = (
    Hello | Ready | Batch | ConfigureSession | ReleaseSessions | Credit | Predictions | ErrorReport | Heartbeat
    | SetWire | Submit | Cancel | TokenEvents | StatusQuery | Status
)
