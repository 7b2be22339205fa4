"""The wire's common ground: the protocol version and its history, the size limits, the field aliases, the
base every message derives from, and what both stages and clients carry (TokenLogprob).

Every message is a frozen msgspec Struct tagged with its kind (``k``) and carrying ``v``, this build's
``PROTOCOL_VERSION``: stage-to-stage messages are in `skippy.protocol.messages`, client ones in
`skippy.protocol.requests`.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, TypeAlias

import msgspec
from msgspec import Meta

from skippy.protocol.kinds import I31, U63, ErrorCode

# 2: Window.tokens, StageTiming.send_ms, Heartbeat.stage_index/sent_at gone
# 3: prefix cache (Window.restore/record/evict, Batch/Predictions.missed, Ready.cache, ReleaseSessions.keep/evict):
#    a peer that ignored a restore would compute on an empty KV, so older peers are refused
# 4: Predictions.credit (an older stage 0 would never get that credit back)
# 5: TokenEvents.stats typed (RequestStats), TokenEvents.sent_direct
# 6: SessionPrediction.draws, ConfigureSession.history/draws (a session replayed after a later stage died: its
#    restarted final stage rebuilds the sampler state; an older final stage would ignore them and resume a
#    seeded request with a fresh RNG and empty penalties, silently giving other tokens)
# 7: Submit.history/chunks/draws, TokenEvents.draws/chunks, ErrorCode.PIPELINE_LOST (a request resumed from
#    the tokens it has after its stage 0 or broker died; an older stage 0 would start it afresh and repeat them);
#    Status.wire, SetWire.whole_chain (the activation wire format certified at startup)
# 8: Submit.resume_from (a ResumePoint) in place of Submit.history/chunks/draws, TokenEvents.chunks renamed
#    chunk_ends (an older stage 0 would ignore resume_from and start the request afresh, repeating its tokens)
# 9: EventBatch (a client's TokenEvents of one step in one message; an older client would drop them all)

PROTOCOL_VERSION: Final = 9  # also the Literal of MessageBase.v
MAX_HEADER_BYTES: Final = 1 << 20
MAX_WINDOWS: Final = 1024
MAX_ROWS: Final = 16384
# a session's tokens (a prompt, a replayed history): a whole context, past one batch's rows (an agent's prompt
# alone can pass 16384 tokens); 2**17 ids stay under MAX_HEADER_BYTES at any vocabulary size (5 bytes each)
MAX_CONTEXT_TOKENS: Final = 1 << 17
MAX_SESSIONS_PER_MESSAGE: Final = 1024
MAX_TIMINGS: Final = 256
MAX_RECORDS: Final = 64  # prefix cache entries one window records
MAX_TOP_LOGPROBS: Final = 64
MAX_MTP_DRAFT: Final = 16  # native-MTP drafts one window asks for (the runtime's MAX_DRAFT_TOKENS)

Tokens: TypeAlias = Annotated[tuple[I31, ...], Meta(max_length=MAX_ROWS)]
ContextTokens: TypeAlias = Annotated[tuple[I31, ...], Meta(max_length=MAX_CONTEXT_TOKENS)]
Sessions: TypeAlias = Annotated[tuple[U63, ...], Meta(max_length=MAX_SESSIONS_PER_MESSAGE)]
Keys: TypeAlias = Annotated[tuple[U63, ...], Meta(max_length=MAX_SESSIONS_PER_MESSAGE)]  # prefix cache entries


class ProtocolError(Exception):
    """An invalid message; ``code`` is one of the first five ErrorCodes."""

    def __init__(self, code: ErrorCode, message: str, request_id: str | None = None) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.request_id = request_id  # a refused request's id where its header names one: its sender gets the error

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class MessageBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="k"):
    """What every message has: its header's ``k`` (the class's tag, its MessageKind) and ``v``."""

    v: Literal[9] = PROTOCOL_VERSION


class TokenLogprob(msgspec.Struct, frozen=True):
    """log p(token) under the model's logits, and the `top` most likely (token, logprob) pairs."""
    token: I31
    logprob: float  # any float: -inf for a token the sampler ruled out
    top: Annotated[tuple[tuple[I31, float], ...], Meta(max_length=MAX_TOP_LOGPROBS)] = ()


Logprobs: TypeAlias = Annotated[tuple[TokenLogprob, ...], Meta(max_length=MAX_ROWS)]

