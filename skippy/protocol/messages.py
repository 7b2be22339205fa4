"""Every message type between skippy processes: small frozen msgspec Structs, one per kind (the client ones
in `skippy.protocol.requests`, the common ground in `skippy.protocol.base`; all re-exported here).

Each field's type says what a peer may send: ``Annotated`` rules (`skippy.protocol.kinds`: ids and
counts int64 >= 0, token ids and positions int32 >= 0, finite floats; the ``MAX_*`` lengths of `skippy.protocol.base`;
the StrEnums), which msgspec checks while it decodes. A message class is tagged with its kind, the
``k`` of its header, and carries ``v``, the protocol version (a keyword field with this build's
version as its default, so nobody passes it). Rules across fields (a window's outputs within its
rows, unique sessions, ...) are `skippy.protocol.codec`'s; it also turns messages into ZeroMQ
multiparts and back: see the package docstring.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeAlias

import msgspec
import numpy as np
from msgspec import Meta

from skippy.protocol.base import (  # noqa: F401 - re-exported
    MAX_CONTEXT_TOKENS,
    MAX_HEADER_BYTES,
    MAX_MTP_DRAFT,
    MAX_RECORDS,
    MAX_ROWS,
    MAX_SESSIONS_PER_MESSAGE,
    MAX_TIMINGS,
    MAX_TOP_LOGPROBS,
    MAX_WINDOWS,
    PROTOCOL_VERSION,
    ContextTokens,
    Keys,
    Logprobs,
    MessageBase,
    ProtocolError,
    Sessions,
    TokenLogprob,
    Tokens,
)
from skippy.protocol.kinds import I31, U63, ErrorCode, FinishReason, Finite, MessageKind, WireDtype  # noqa: F401 - re-exported
from skippy.protocol.requests import (  # noqa: F401 - re-exported
    Cancel,
    EventBatch,
    PromptProgress,
    ResumePoint,
    StagePrefillRate,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
    WireVerdict,
)


class StageIdentity(msgspec.Struct, frozen=True):
    """What a stage announces: its layer range ``[layer_start, layer_end)`` of which model."""
    stage_id: str
    stage_index: I31
    layer_start: I31
    layer_end: I31  # >= layer_start
    model_digest: str
    n_embd: Annotated[int, Meta(ge=1, le=2**31 - 1)]


class CacheCaps(msgspec.Struct, frozen=True):
    """What the prefix caches of a stage and every stage after it can hold, together: the fewest
    KV cells and entries any of them keeps, the KV bytes of one cell summed over them, and whether
    a restore may take any first positions of an entry (with sliding-window layers, whose kept state
    holds only the entry's last window, only all of it or all but its last position)."""
    cells: U63
    entries: U63
    cell_bytes: U63
    partial: bool = True


class PrefixRef(msgspec.Struct, frozen=True):
    """A prefix cache entry named by stage 0 (``key``: a hash of the model, topology and the entry's
    tokens). Recording: the entry is the session's first ``n_tokens`` positions. Restoring: copy the
    entry's first ``n_tokens`` positions (an entry at least that long; stage 0 checked the tokens)."""
    key: U63
    n_tokens: Annotated[int, Meta(ge=1, le=2**31 - 1)]


class Hello(MessageBase, tag=MessageKind.HELLO.value, frozen=True):
    """Upstream -> downstream at startup; ``reply_endpoint`` is where credits go."""
    sender: StageIdentity
    reply_endpoint: str


class Ready(MessageBase, tag=MessageKind.READY.value, frozen=True):
    """Downstream -> upstream: the Hello is accepted; ``cache`` is None when a stage from here on
    keeps no prefix cache (then stage 0 uses none)."""
    sender: StageIdentity
    cache: CacheCaps | None = None


class Window(msgspec.Struct, frozen=True):
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

    Native MTP (docs/mtp.md): ``input_tokens`` are the rows' token ids (stage 0 sends them when its plan
    drafts with native MTP: the final stage's NextN block pairs each with the trunk's hidden state), and
    ``mtp_draft_max`` asks the final stage for that many MTP drafts after the window's last sample
    (``SessionPrediction.mtp_draft``). A stage that does not know the fields ignores them: no drafts.
    """
    session_id: U63
    pos_start: I31
    n_tokens: Annotated[int, Meta(ge=1, le=2**63 - 1)]  # a batch's rows together: at most MAX_ROWS
    outputs: Annotated[tuple[U63, ...], Meta(max_length=MAX_ROWS)] = ()  # strictly increasing, < n_tokens
    draft: Tokens = ()
    head: I31 | None = None
    restore: PrefixRef | None = None  # n_tokens == pos_start
    record: Annotated[tuple[PrefixRef, ...], Meta(max_length=MAX_RECORDS)] = ()  # n_tokens <= pos_start + n_tokens
    evict: Keys = ()
    input_tokens: Tokens = ()  # () or n_tokens ids
    mtp_draft_max: Annotated[int, Meta(ge=0, le=MAX_MTP_DRAFT)] = 0


class StageTiming(msgspec.Struct, frozen=True):
    """One stage's handling of a batch: wall-clock seconds (time.time()) and durations in ms."""
    stage_id: str
    recv_at: Finite
    compute_ms: Finite
    credit_wait_ms: Finite
    sent_at: Finite


Timings: TypeAlias = Annotated[tuple[StageTiming, ...], Meta(max_length=MAX_TIMINGS)]


class Batch(MessageBase, tag=MessageKind.BATCH.value, frozen=True, eq=False):
    """Rows from many sessions; ``hidden`` is float32 ``[n_rows, n_embd]`` (None into stage 0).

    ``wire_dtype`` is how ``hidden`` travels in frame 1 (decoded back to float32 on arrival); a
    header without it (an older peer) means f32. ``missed``: sessions whose windows a stage on the way
    dropped because it did not have the prefix cache entry they restore.
    """
    batch_id: U63
    windows: Annotated[tuple[Window, ...], Meta(min_length=1, max_length=MAX_WINDOWS)]  # one per session
    hidden: np.ndarray | None = None  # frame 1, never in the header (a header may only say nil)
    timings: Timings = ()
    wire_dtype: WireDtype = WireDtype.F32
    missed: Sessions = ()

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


class ConfigureSession(MessageBase, tag=MessageKind.CONFIGURE.value, frozen=True):
    """Sampling settings for a session, sent once; ``sampling`` is ``SamplingParams.to_dict()``. A session
    replayed after a later stage died carries its sampler's state: ``history`` (the tokens committed so far,
    accepted into the chain: penalties, grammar) and ``draws`` (the RNG draws its dist sampler had made)."""
    session_id: U63
    sampling: dict[str, Any]
    history: ContextTokens = ()
    draws: U63 = 0


class KeptPrefix(msgspec.Struct, frozen=True):
    """A finished session's first ``ref.n_tokens`` positions (its prompt and reply), kept as an entry."""
    session_id: U63
    ref: PrefixRef


class ReleaseSessions(MessageBase, tag=MessageKind.RELEASE.value, frozen=True):
    """Forget these sessions (KV and sampler state); first drop the prefix cache entries ``evict``
    names, then keep each of ``keep`` (a conversation's next turn restores its reply too)."""
    session_ids: Sessions
    keep: Annotated[tuple[KeptPrefix, ...], Meta(max_length=MAX_SESSIONS_PER_MESSAGE)] = ()
    evict: Keys = ()


class Credit(MessageBase, tag=MessageKind.CREDIT.value, frozen=True):
    """Receiver -> sender: batch ``batch_id`` was taken, one more may be sent."""
    batch_id: U63
    stage_id: str


class SessionPrediction(msgspec.Struct, frozen=True):
    """One token per requested output position of a session's window, in order (+ logprobs if asked);
    ``draws``: the RNG draws the session's sampler has made in all (a replay restores them); ``mtp_draft``:
    the final stage's native-MTP drafts continuing ``tokens`` (asked by ``Window.mtp_draft_max``)."""
    session_id: U63
    tokens: Tokens
    logprobs: Logprobs = ()
    draws: U63 = 0
    mtp_draft: Annotated[tuple[I31, ...], Meta(max_length=MAX_MTP_DRAFT)] = ()


class Predictions(MessageBase, tag=MessageKind.PREDICTIONS.value, frozen=True):
    """Final stage -> stage 0: the sampled tokens of a batch; ``missed`` as in Batch (a stage that
    dropped every window of a batch answers for it itself). ``credit``: the answering stage is stage 0's
    own downstream and returns the batch's credit here instead of in a Credit message of its own."""
    batch_id: U63
    results: Annotated[tuple[SessionPrediction, ...], Meta(max_length=MAX_SESSIONS_PER_MESSAGE)]  # one per session
    timings: Timings = ()
    missed: Sessions = ()
    credit: bool = False


class ErrorReport(MessageBase, tag=MessageKind.ERROR.value, frozen=True):
    """A stage could not handle something; ``batch_id``/``session_ids`` say what, when known."""
    code: ErrorCode
    message: str
    stage_id: str
    batch_id: U63 | None = None
    session_ids: Sessions = ()


class Heartbeat(MessageBase, tag=MessageKind.HEARTBEAT.value, frozen=True):
    """Liveness: a PUSH queues silently toward a dead peer, so silence must be noticed. ``incarnation``
    names the sending process: another one means the stage restarted (its sessions are gone)."""
    stage_id: str
    incarnation: str = ""


class SetWire(MessageBase, tag=MessageKind.WIRE.value, frozen=True):
    """Change the wire condition of a running stage's downstream link (scripts/wire-delay);
    ``activation_dtype`` None keeps the link's activation encoding. ``whole_chain``: set only
    ``activation_dtype``, on this stage's link and, forwarded, on every link below it (the delay
    fields are ignored): stage 0's startup certification (skippy.driver.wire_certify)."""
    delay_ms: Finite
    mbps: Finite | None = None
    activation_dtype: WireDtype | None = None
    whole_chain: bool = False


Message: TypeAlias = (
    Hello | Ready | Batch | ConfigureSession | ReleaseSessions | Credit | Predictions | ErrorReport | Heartbeat
    | SetWire | Submit | Cancel | TokenEvents | EventBatch | StatusQuery | Status
)
