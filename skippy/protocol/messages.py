"""Every message type between skippy processes: small frozen dataclasses, one per kind.

`skippy.protocol.codec` turns them into ZeroMQ multiparts and back; see the package docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

from skippy.protocol.kinds import ErrorCode, FinishReason, MessageKind, WireDtype  # noqa: F401 - re-exported
from skippy.protocol.stats import RequestStats

_FRAME = {"frame": True}  # field metadata: travels as frame 1, not in the header


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
class CacheCaps:
    """What the prefix caches of a stage and every stage after it can hold, together: the fewest
    KV cells and entries any of them keeps, and the KV bytes of one cell summed over them."""
    cells: int
    entries: int
    cell_bytes: int


@dataclass(frozen=True)
class PrefixRef:
    """A prefix cache entry named by stage 0 (``key``: a hash of the model, topology and the entry's
    tokens). Recording: the entry is the session's first ``n_tokens`` positions. Restoring: copy the
    entry's first ``n_tokens`` positions (an entry at least that long; stage 0 checked the tokens)."""
    key: int
    n_tokens: int


@dataclass(frozen=True)
class Hello:
    """Upstream -> downstream at startup; ``reply_endpoint`` is where credits go."""
    sender: StageIdentity
    reply_endpoint: str


@dataclass(frozen=True)
class Ready:
    """Downstream -> upstream: the Hello is accepted; ``cache`` is None when a stage from here on
    keeps no prefix cache (then stage 0 uses none)."""
    sender: StageIdentity
    cache: CacheCaps | None = None


@dataclass(frozen=True)
class Window:
    """One session's rows in a batch; ``outputs`` are row offsets whose predictions are wanted.

    A verify window carries ``draft``: the tokens proposed after its first row (rows 1..n-1 are
    ``draft``). The final stage samples its rows in order and stops at the first sample that differs
    from the draft, returning accepted + 1 tokens. A *chained* verify window (pipelined behind another
    of its session) also carries ``head``, its first row's input: a guess of the previous window's
    last sample. The final stage verifies it only if that guess came true at ``pos_start``;
    otherwise the window is stale and comes back with no tokens.

    Prefix cache operations (stage 0 decides, every stage applies them in this order): ``restore``
    replaces the session's KV by an entry's ``n_tokens`` positions before the window runs
    (``pos_start`` equals them); after it runs, the entries ``evict`` names are dropped and the
    session's first ``n_tokens`` positions are kept as each entry of ``record``. A stage without the
    restored entry drops the window and reports the session in ``missed``.
    """
    session_id: int
    pos_start: int
    n_tokens: int
    outputs: tuple[int, ...] = ()
    draft: tuple[int, ...] = ()
    head: int | None = None
    restore: PrefixRef | None = None
    record: tuple[PrefixRef, ...] = ()
    evict: tuple[int, ...] = ()


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
    """Rows from many sessions; ``hidden`` is float32 ``[n_rows, n_embd]`` (None into stage 0).

    ``wire_dtype`` is how ``hidden`` travels in frame 1 (decoded back to float32 on arrival); a
    header without it (an older peer) means f32. ``missed``: sessions whose windows a stage on the way
    dropped because it did not have the prefix cache entry they restore.
    """
    batch_id: int
    windows: tuple[Window, ...]
    hidden: np.ndarray | None = field(default=None, metadata=_FRAME)
    timings: tuple[StageTiming, ...] = ()
    wire_dtype: WireDtype = WireDtype.F32
    missed: tuple[int, ...] = ()

    @property
    def n_rows(self) -> int:
        return sum(w.n_tokens for w in self.windows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        a, b = self.hidden, other.hidden
        same = a is b or (a is not None and b is not None and np.array_equal(a, b))
        return same and ((self.batch_id, self.windows, self.timings, self.wire_dtype, self.missed)
                     == (other.batch_id, other.windows, other.timings, other.wire_dtype, other.missed))


@dataclass(frozen=True)
class ConfigureSession:
    """Sampling settings for a session, sent once; ``sampling`` is ``SamplingParams.to_dict()``."""
    session_id: int
    sampling: dict[str, Any]


@dataclass(frozen=True)
class KeptPrefix:
    """A finished session's first ``ref.n_tokens`` positions (its prompt and reply), kept as an entry."""
    session_id: int
    ref: PrefixRef


@dataclass(frozen=True)
class ReleaseSessions:
    """Forget these sessions (KV and sampler state); first drop the prefix cache entries ``evict``
    names, then keep each of ``keep`` (a conversation's next turn restores its reply too)."""
    session_ids: tuple[int, ...]
    keep: tuple[KeptPrefix, ...] = ()
    evict: tuple[int, ...] = ()


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
    """Final stage -> stage 0: the sampled tokens of a batch; ``missed`` as in Batch (a stage that
    dropped every window of a batch answers for it itself). ``credit``: the answering stage is stage 0's
    own downstream and returns the batch's credit here instead of in a Credit message of its own."""
    batch_id: int
    results: tuple[SessionPrediction, ...]
    timings: tuple[StageTiming, ...] = ()
    missed: tuple[int, ...] = ()
    credit: bool = False


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
    """Liveness: a PUSH queues silently toward a dead peer, so silence must be noticed. ``incarnation``
    names the sending process: another one means the stage restarted (its sessions are gone)."""
    stage_id: str
    incarnation: str = ""


@dataclass(frozen=True)
class SetWire:
    """Change the wire condition of a running stage's downstream link (scripts/wire-delay);
    ``activation_dtype`` None keeps the link's activation encoding."""
    delay_ms: float
    mbps: float | None = None
    activation_dtype: WireDtype | None = None


@dataclass(frozen=True)
class Submit:
    """Client -> stage 0: generate from prompt token ids; ``sampling`` is ``SamplingParams.to_dict()``.

    ``events_to``: an ``ipc://`` endpoint (a PULL the client binds) where stage 0 pushes this request's
    TokenEvents itself, final one included, instead of through the broker; the submitter still gets a
    copy of the final event with ``TokenEvents.sent_direct`` set (skippy.driver.direct_events).
    """
    request_id: str
    prompt: tuple[int, ...]
    sampling: dict[str, Any]
    max_tokens: int
    stop_tokens: tuple[int, ...] = ()
    events_to: str | None = None


@dataclass(frozen=True)
class Cancel:
    """Client -> stage 0: stop a request (its sessions are released on every stage)."""
    request_id: str


@dataclass(frozen=True)
class TokenEvents:
    """Stage 0 / broker -> client: new tokens of a request; ``finish_reason`` set on the last one.

    ``code`` classifies an error (skippy.protocol.kinds.HTTP_STATUS maps it to an HTTP status). On the
    last message, ``stats`` are the request's numbers; ``sent_direct`` is set only on the submitter's copy
    of the final event of a request whose events went straight to its client (``Submit.events_to``):
    how many tokens went that way.
    """
    request_id: str
    tokens: tuple[int, ...]
    finish_reason: FinishReason | None = None
    error: str | None = None
    code: ErrorCode | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    stats: RequestStats | None = None
    sent_direct: int | None = None


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
