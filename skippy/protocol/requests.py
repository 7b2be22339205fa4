"""Client <-> stage 0 (or the broker, which speaks the same): submit, cancel, token events, status.

A `PipelineClient` (skippy.client) sends Submit, Cancel and StatusQuery; stage 0 and the broker answer with
TokenEvents and Status. Stage-to-stage messages are `skippy.protocol.messages`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from skippy.protocol.base import MAX_SESSIONS_PER_MESSAGE, MAX_TIMINGS, ContextTokens, Logprobs, MessageBase, Tokens
from skippy.protocol.kinds import U63, ErrorCode, FinishReason, Finite, MessageKind, WireDtype
from skippy.protocol.stats import RequestStats


class StagePrefillRate(msgspec.Struct, frozen=True):
    """One stage's prefill rate for a prompt: the prompt's positions prefilled so far over that stage's compute
    seconds on the batches carrying them (a batch shared with other requests counts in full: it is the stage's rate
    on batches carrying this prompt)."""
    stage_id: str
    tokens_per_s: Finite


class PromptProgress(msgspec.Struct, frozen=True):
    """A prompt's prefill so far (llama-server's `prompt_progress`): ``processed`` of ``total`` positions have come
    back through every stage, ``cache`` of them restored from the prefix cache; ``time_ms`` since admission;
    ``stages``: each stage's prefill rate on this prompt, in pipeline order."""
    total: U63
    cache: U63
    processed: U63
    time_ms: Finite
    stages: Annotated[tuple[StagePrefillRate, ...], Meta(max_length=MAX_TIMINGS)] = ()


class ResumePoint(msgspec.Struct, frozen=True):
    """Where a request lost with its stage 0 or broker resumes: ``history``, the tokens its client was sent
    (they count toward ``max_tokens``; at least one, else it starts afresh), ``chunk_ends``, where its
    prompt's prefill chunks ended (TokenEvents.chunk_ends), and ``draws``, the sampler's RNG draws after
    ``history`` (TokenEvents.draws). Stage 0 prefills them again in those chunks, as a replay does, so the KV
    and the sampler state are the ones the lost stage 0 had."""
    history: Annotated[ContextTokens, Meta(min_length=1)]
    chunk_ends: Tokens = ()
    draws: U63 = 0


class Submit(MessageBase, tag=MessageKind.SUBMIT.value, frozen=True):
    """Client -> stage 0: generate from prompt token ids; ``sampling`` is ``SamplingParams.to_dict()``.

    ``events_to``: an ``ipc://`` endpoint (a PULL the client binds) where stage 0 pushes this request's
    TokenEvents itself, final one included, instead of through the broker; the submitter still gets a
    copy of the final event with ``TokenEvents.sent_direct`` set (skippy.driver.direct_events).
    ``progress``: send PromptProgress events while the prompt prefills (``TokenEvents.progress``).

    ``resume_from``: set when the client resumes a request its first stage 0 or broker lost
    (ErrorCode.PIPELINE_LOST): what it already has (ResumePoint); stage 0 replays it and continues from the
    next token.
    """
    request_id: str
    prompt: ContextTokens
    sampling: dict[str, Any]
    max_tokens: Annotated[int, Meta(ge=1, le=2**31 - 1)]
    stop_tokens: Tokens = ()
    events_to: str | None = None
    resume_from: ResumePoint | None = None
    progress: bool = False


class Cancel(MessageBase, tag=MessageKind.CANCEL.value, frozen=True):
    """Client -> stage 0: stop a request (its sessions are released on every stage).

    A broker takes a cancel only from the request's submitter, or from a client naming the request's
    ``Submit.events_to`` in ``events_to``: one bound there after it (an adapter restarted on the same events
    endpoint gets the events of its predecessor's requests, which nobody reads now).
    ``abandoned``: its client went away (an HTTP client disconnected), as opposed to a cancel the client meant
    (a stop string matched): stage 0 and the broker log it (``request_abandoned``) and count it.
    """
    request_id: str
    events_to: str | None = None
    abandoned: bool = False


class TokenEvents(MessageBase, tag=MessageKind.TOKENS.value, frozen=True):
    """Stage 0 / broker -> client: what one step gave a request: its new tokens (every token it committed in
    that step, several when a speculative window accepted drafts) and, on the last message, ``finish_reason``.
    Stage 0 merges a request's events of one step into one TokenEvents; in-process consumers iterate the same
    type (skippy.request_events.RequestHandle).

    ``code`` classifies an error (skippy.protocol.kinds.HTTP_STATUS maps it to an HTTP status). On the
    last message, ``stats`` are the request's numbers; ``sent_direct`` is set only on the submitter's copy
    of the final event of a request whose events went straight to its client (``Submit.events_to``):
    how many tokens went that way. What a client needs to resume the request comes in pieces (ResumePoint):
    ``draws``, the sampler's RNG draws after these tokens; ``chunk_ends``, on the message with the request's
    first token, where its prompt's prefill chunks ended.
    ``progress``: a prompt progress report (no tokens; Submit.progress).
    """
    request_id: str
    tokens: Tokens
    finish_reason: FinishReason | None = None
    error: str | None = None
    code: ErrorCode | None = None
    logprobs: Logprobs = ()
    stats: RequestStats | None = None
    sent_direct: U63 | None = None
    draws: U63 = 0
    chunk_ends: Tokens = ()
    progress: PromptProgress | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


class EventBatch(MessageBase, tag=MessageKind.EVENTS.value, frozen=True):
    """Stage 0 / broker -> client: the TokenEvents of one step for every request of one client, in one message
    (a lone event travels as itself)."""
    events: Annotated[tuple[TokenEvents, ...], Meta(min_length=1, max_length=MAX_SESSIONS_PER_MESSAGE)]


def event_message(events: Sequence[TokenEvents]) -> TokenEvents | EventBatch:
    """One message for a client's events of one step."""
    return events[0] if len(events) == 1 else EventBatch(tuple(events))


def events_of(msg: TokenEvents | EventBatch) -> tuple[TokenEvents, ...]:
    return msg.events if isinstance(msg, EventBatch) else (msg,)


class StatusQuery(MessageBase, tag=MessageKind.STATUS_QUERY.value, frozen=True):
    """Client -> stage 0: is the pipeline up, and how loaded is it."""
    nonce: U63


class WireVerdict(msgspec.Struct, frozen=True):
    """Stage 0's startup certification of the activation wire format (skippy.driver.wire_certify):
    the format asked (f32 | f16 | q8 | auto), the one the links use, and per format tried its
    final-stage argmax agreement with f32 over ``positions`` decisive calibration positions."""
    asked: str
    used: WireDtype
    tried: tuple[tuple[WireDtype, float], ...] = ()
    positions: U63 = 0
    certified: bool = True  # False: served without certification (--no-activation-wire-certify, or one stage)


class Status(MessageBase, tag=MessageKind.STATUS.value, frozen=True):
    """Stage 0 -> client: pipeline readiness and load; ``wire``: the activation wire's verdict."""
    nonce: U63
    ready: bool
    dead_stage: str | None
    running: U63
    waiting: U63
    lane_count: U63
    ctx_size: U63
    wire: WireVerdict | None = None
