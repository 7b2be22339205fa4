"""Certifying the activation wire format at startup: f16 or q8 on the links must keep f32's argmax.

When `--activation-wire-dtype` asks for f16, q8 or auto and stage 0 has a downstream, stage 0 runs a
short calibration prompt (`CALIBRATION_TEXT`'s first `CALIBRATION_TOKENS` tokens, teacher-forced:
every position's logits) through the real split once with f32 on every link and once per candidate
format, switching every link with a `whole_chain` SetWire that travels ahead of the batches. Per
position it compares the final stage's argmax (the greedy token) and f32's top-2 margin (logprob of
the best minus the second, in nats = a logit difference). Positions where f32's margin is at most
`MARGIN_EPS` are near-ties that the Q4 model's own noise flips; they are not counted. The format
passes when its argmax equals f32's at a fraction >= `MIN_AGREEMENT` of the counted positions (one at least).
A format asked by name that fails refuses the start (`WireRefused`, naming the format, the measured
agreement and the flag); `auto` tries q8 then f16 and falls back to f32. The links are left in the
format used, and the `WireVerdict` goes into stage 0's `pipeline_ready`/`ready` lines and its Status.
When a later stage is back after a restart, stage 0 sets the format used on the chain again. The
calibration runs on the reserved session that the speculation calibration uses (skippy.driver.verify_costs),
and is released on every stage after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from skippy.config import ConfigError, ServingOptions, WireChoice
from skippy.driver.batches import BatchLauncher
from skippy.driver.scheduler import PlannedWindow
from skippy.driver.verify_costs import CALIBRATION_SESSION, Release, calibration_sequence
from skippy.log import get_logger
from skippy.protocol import ConfigureSession, Predictions, SetWire, WireDtype, WireVerdict
from skippy.runtime.llama_model import LlamaModel
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.stage_params import MAX_DRAFT_TOKENS
from skippy.runtime.tokenizer import Tokenizer
from skippy.stage.links import DownstreamLink, apply_wire

__all__ = ["CALIBRATION_TEXT", "MARGIN_EPS", "MIN_AGREEMENT", "WireRefused", "agreement", "calibration_prompt",
           "certify_wire", "set_chain_wire", "verdict_fields"]

CALIBRATION_TEXT = ("The capital of France is Paris. Water boils at 100 degrees Celsius, and the sun rises in the"
                    " east every morning.")
CALIBRATION_TOKENS = 32
MARGIN_EPS = 0.5  # nats: f32's top-2 margin at or below this is a near-tie, not counted
MIN_AGREEMENT = 0.9  # fraction of counted positions whose argmax must equal f32's
AUTO_ORDER = (WireDtype.Q8, WireDtype.F16)  # smallest first; f32 when neither passes
ROWS_PER_WINDOW = MAX_DRAFT_TOKENS + 1  # the output rows a final stage keeps per lane by default

Ranked = list[tuple[int, float]]  # per position: (argmax, top-2 margin in nats)


class WireRefused(ConfigError):
    """The asked activation wire format disagrees with f32 beyond the tolerance: stage 0 does not start."""


def agreement(reference: Ranked, candidate: Ranked, eps: float = MARGIN_EPS) -> tuple[float, int]:
    """(fraction of decisive positions whose argmax agrees, decisive positions): decisive = f32 margin > eps."""
    decisive = [(ref[0], got[0]) for ref, got in zip(reference, candidate, strict=True) if ref[1] > eps]
    if not decisive:
        return 1.0, 0
    return sum(a == b for a, b in decisive) / len(decisive), len(decisive)


def calibration_prompt(model: LlamaModel, ctx_size: int) -> list[int]:
    """`CALIBRATION_TEXT`'s first tokens in the model's own vocabulary (fewer when the context is short)."""
    tokens = Tokenizer(model).encode(CALIBRATION_TEXT)
    return [t for t in tokens if 0 <= t < model.n_vocab][:min(CALIBRATION_TOKENS, ctx_size - 1)]


def verdict_fields(verdict: WireVerdict | None) -> dict[str, Any] | None:
    """The verdict as log fields: asked, used, agreement per format tried, positions, certified."""
    if verdict is None:
        return None
    return {"asked": verdict.asked, "used": str(verdict.used), "agreement": {str(d): a for d, a in verdict.tried},
            "positions": verdict.positions, "certified": verdict.certified}


def set_chain_wire(link: DownstreamLink, dtype: WireDtype, log: Any) -> None:
    """Set `dtype` on this link now and, by a `whole_chain` SetWire ahead of the next batch, on every link below.
    Also what stage 0 does when a later stage is back (a restarted one starts with the flag's format, f32 under
    auto): the certified format is set on the chain again."""
    apply_wire(link, SetWire(0.0, None, dtype, whole_chain=True), log)


async def certify_wire(launcher: BatchLauncher, options: ServingOptions, prompt: Sequence[int], release: Release,
                       timeout_s: float = 60.0) -> WireVerdict:
    """Run the calibration through the real split and pick the format (or raise `WireRefused`)."""
    asked, link = options.activation_wire, launcher.downstream
    if asked is WireChoice.F32 or link is None or not options.certify_wire:
        return WireVerdict(str(asked), asked.initial, certified=asked is WireChoice.F32)
    candidates = AUTO_ORDER if asked is WireChoice.AUTO else (WireDtype(asked.value),)
    log = get_logger()

    link.enqueue(ConfigureSession(CALIBRATION_SESSION, SamplingParams(top_logprobs=2).to_dict()))
    tried: list[tuple[WireDtype, float]] = []
    positions = 0
    try:
        set_chain_wire(link, WireDtype.F32, log)
        reference = await _ranked(launcher, options, prompt, timeout_s)
        for dtype in candidates:
            set_chain_wire(link, dtype, log)
            score, positions = agreement(reference, await _ranked(launcher, options, prompt, timeout_s))
            tried.append((dtype, round(score, 4)))
            log.info("wire_calibrated", activation_dtype=str(dtype), agreement=round(score, 4), positions=positions,
                     min_agreement=MIN_AGREEMENT, margin_eps=MARGIN_EPS)
            if positions and score >= MIN_AGREEMENT:  # no decisive position certifies nothing
                return WireVerdict(str(asked), dtype, tuple(tried), positions)
        set_chain_wire(link, WireDtype.F32, log)
    finally:
        await release((CALIBRATION_SESSION,))
    if asked is WireChoice.AUTO:
        return WireVerdict(str(asked), WireDtype.F32, tuple(tried), positions)
    dtype, score = tried[0]
    raise WireRefused(
        f"--activation-wire-dtype {dtype}: the final stage's argmax agrees with f32 at {score:.3f} of {positions}"
        f" calibration positions (f32 top-2 margin > {MARGIN_EPS} nats), below the {MIN_AGREEMENT} required;"
        " use --activation-wire-dtype f32, or auto for the smallest format that passes"
        " (--no-activation-wire-certify serves it uncertified)")


async def _ranked(launcher: BatchLauncher, options: ServingOptions, prompt: Sequence[int], timeout_s: float) -> Ranked:
    """Teacher-forced: the prompt in windows of `ROWS_PER_WINDOW` rows, logits on every row."""
    seq = calibration_sequence(options.prefill)
    tokens = np.asarray(prompt, np.int32)
    ranked: Ranked = []
    for start in range(0, len(tokens), ROWS_PER_WINDOW):
        chunk = tokens[start:start + ROWS_PER_WINDOW]
        window = PlannedWindow(seq, start, chunk, tuple(range(len(chunk))))
        try:
            msg = await asyncio.wait_for(launcher.round_trip([window]), timeout_s)
        finally:
            seq.in_flight = 0
        ranked.extend(_argmax_margins(msg))
    return ranked


def _argmax_margins(msg: Predictions) -> Ranked:
    (result,) = msg.results
    out: Ranked = []
    for token, logprob in zip(result.tokens, result.logprobs, strict=True):
        (_, best), (_, second) = logprob.top[:2]
        out.append((token, best - second))
    return out
