"""Post-processing: a batch's predictions become committed tokens, client events and finishes.

The other half of `plan_iteration`: for every window of a batch that came back, commit what the
final stage sampled (stop tokens, max_tokens and the context limit end a request), feed the
prefill chunk planner, and say what the driver must deliver. Pure bookkeeping, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import msgspec

from skippy.driver.batches import InFlight
from skippy.driver.prefill import ChunkObservation
from skippy.driver.scheduler import PlannedWindow
from skippy.driver.sequence import SeqState, Sequence
from skippy.protocol import FinishReason, Predictions, PromptProgress, StagePrefillRate, TokenEvents, TokenLogprob


@dataclass
class Outcome:
    """What one window's return means for its request."""

    seq: Sequence
    events: list[TokenEvents] = field(default_factory=list)  # a progress report, then the window's tokens
    finish: FinishReason | None = None
    error: str | None = None
    committed: list[int] = field(default_factory=list)  # tokens added to the sequence
    proposed: int = 0  # draft tokens the window carried
    returned: int = 0  # tokens the final stage sampled (accepted + 1 for a verify window)
    stale_rows: int = 0  # rows of a chained window discarded because the chain broke before it
    chain_miss: bool = False  # a stage lacked the prefix cache entry the window restores: prefill again
    mtp_draft: tuple[int, ...] = ()  # the final stage's native-MTP drafts after the committed tokens


def commit_tokens(seq: Sequence, tokens: Seq[int], logprobs: Seq[TokenLogprob | None], ctx_size: int) -> Outcome:
    """Commit sampled tokens in order until one ends the request (a stop token is not delivered)."""
    out = Outcome(seq)
    if tokens and seq.first_token_at is None:
        seq.first_token_at = time.perf_counter()
    delivered: list[int] = []
    delivered_logprobs: list[TokenLogprob] = []
    for token, logprob in zip(tokens, logprobs):
        seq.generated.append(token)
        out.committed.append(token)
        if token in seq.stop_tokens:
            out.finish = FinishReason.STOP
            break
        delivered.append(token)
        if logprob is not None:
            delivered_logprobs.append(logprob)
        if len(seq.generated) >= seq.max_tokens or len(seq.prompt) + len(seq.generated) >= ctx_size:
            out.finish = FinishReason.LENGTH
            break
    if delivered:
        logprobs_all = tuple(delivered_logprobs) if len(delivered_logprobs) == len(delivered) else ()
        out.events.append(TokenEvents(seq.request_id, tuple(delivered), logprobs=logprobs_all))
    return out


def postprocess(entry: InFlight, msg: Predictions, ctx_size: int) -> list[Outcome]:
    """Outcomes for every window of a batch whose predictions (or end of pipeline) came back."""
    tokens = {r.session_id: r.tokens for r in msg.results}
    draws = {r.session_id: r.draws for r in msg.results}
    missed = set(msg.missed)
    logprobs = {r.session_id: r.logprobs for r in msg.results}
    mtp = {r.session_id: r.mtp_draft for r in msg.results if r.mtp_draft}
    # the slowest stage's compute per row bounds how large the next prefill chunk may grow
    slowest = max((t.compute_ms / max(1, entry.rows) for t in msg.timings), default=None)
    observation = ChunkObservation(entry.compute_ms, entry.write_ms(), entry.credit_wait_ms, slowest)
    outcomes = []
    for pw in entry.plan:
        seq = pw.seq
        seq.in_flight = max(0, seq.in_flight - 1)
        seq.add_timings(msg.timings)
        if pw.is_prefill:
            seq.planner.observe(observation)
            seq.add_prefill(len(pw.tokens), msg.timings)
        if seq.state is SeqState.FINISHED or seq.paused:
            continue  # back after its request ended, or paused (a stage died: replayed, or ended there if cancelled)
        if seq.cancelled:  # it ends once none of its windows is in flight: every stage then holds what it was sent
            if not seq.in_flight:
                outcomes.append(Outcome(seq, finish=FinishReason.CANCELLED))
        elif pw.attempt != seq.attempt:
            continue  # a window abandoned (a chain miss, a replay)
        elif seq.session_id in missed:
            outcomes.append(Outcome(seq, chain_miss=True))
        elif pw.epoch != seq.epoch:  # chained behind a window that broke the chain: discard
            outcomes.append(Outcome(seq, stale_rows=len(pw.tokens)))
        elif pw.outputs:
            outcome = _commit_window(pw, tokens.get(seq.session_id), logprobs.get(seq.session_id) or (), ctx_size)
            if outcome.committed:
                seq.draws = draws.get(seq.session_id, seq.draws)  # the sampler state these tokens leave
                outcome.mtp_draft = mtp.get(seq.session_id, ())
                _resumable(outcome)
            if pw.is_prefill and seq.progress:  # the prompt's last chunk: its report comes before the first token
                outcome.events.insert(0, progress_event(pw))
            outcomes.append(outcome)
        elif pw.is_prefill and seq.progress:
            outcomes.append(Outcome(seq, events=[progress_event(pw)]))
    return outcomes


def _resumable(outcome: Outcome) -> None:
    """Stamp the window's tokens with what resuming the request needs (skippy.protocol.ResumePoint): the draws
    after the window, and on the request's first tokens the prompt's chunk ends."""
    seq, events = outcome.seq, outcome.events
    if not events:
        return
    first = len(seq.generated) == len(outcome.committed)
    events[-1] = msgspec.structs.replace(events[-1], draws=seq.draws, chunk_ends=tuple(seq.chunk_ends) if first else ())


def progress_event(pw: PlannedWindow) -> TokenEvents:
    """The prompt's progress once this prefill chunk came back through every stage."""
    seq = pw.seq
    started = seq.admitted_at if seq.admitted_at is not None else seq.submitted_at
    processed = min(len(seq.prompt), pw.pos_start + len(pw.tokens))
    stages = tuple(StagePrefillRate(stage, round(rate, 3)) for stage, rate in seq.prefill_rates().items())
    return TokenEvents(seq.request_id, (), progress=PromptProgress(len(seq.prompt), seq.prefix.matched, processed,
                                                                 round((time.perf_counter() - started) * 1000, 3), stages))


def _commit_window(pw: PlannedWindow, got: Seq[int] | None, lps: Seq[TokenLogprob], ctx_size: int) -> Outcome:
    seq = pw.seq
    verify = bool(pw.draft) or pw.head is not None
    if not got:
        error = f"final stage returned no prediction for session {seq.session_id}"
        return Outcome(seq, finish=FinishReason.ERROR, error=error)
    got = got if verify else got[:1]  # a verify window returns accepted + 1 tokens
    out = commit_tokens(seq, got, [lps[i] if i < len(lps) else None for i in range(len(got))], ctx_size)
    out.proposed, out.returned = len(pw.draft), len(got)
    # the chain behind this window holds if all drafts were accepted and the bonus token is its guess
    if verify and (len(got) <= len(pw.draft) or (pw.next_guess is not None and got[-1] != pw.next_guess)):
        seq.epoch += 1
        seq.chain = []
    return out
