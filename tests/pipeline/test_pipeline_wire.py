"""An emulated 50 ms wire delay on every downstream link shows in the driver's hop timings, not in the tokens.

`--downstream-wire-delay-ms 50` at the driver and every stage: each hop (a stage's `sent_at` to the
next stage's `recv_at`) of every batch takes at least 50 ms, and the generated tokens equal those of
the same pipeline without delay (requests one at a time, so the batches are the same).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline_helpers import Pipeline, generate_each, random_prompt, reference_generate, run, running_driver

DELAY_MS = 50.0
TOLERANCE_MS = 1.0
SPLITS = [2, 4]
MAX_TOKENS = 8


def _generate(pipe: Pipeline, prompts: list[list[int]],
              flags: tuple[str, ...]) -> tuple[list[list[int]], list[list[float]]]:
    async def body() -> tuple[list[list[int]], list[list[float]]]:
        async with running_driver(pipe, *flags) as driver:
            assert driver.options.wire.delay_ms == (DELAY_MS if flags else 0.0)
            tokens = await generate_each(driver, prompts, MAX_TOKENS)
            return tokens, [list(h) for h in driver.stats.hop_ms]

    got = run(body())
    assert all(code == 0 for code in pipe.stop().values())
    return got


def test_wire_delay_shows_per_hop_and_keeps_outputs(tiny_model: Callable[..., Path],
                                                    make_pipeline: Callable[..., Pipeline]) -> None:
    model = tiny_model("llama")
    prompts = [random_prompt(n, 500 + n, 400) for n in (11, 40)]
    flags = ("--downstream-wire-delay-ms", str(int(DELAY_MS)))

    plain = make_pipeline(model, SPLITS, lane_count=2, ctx_size=128)
    plain_tokens, _ = _generate(plain, prompts, ())

    delayed = make_pipeline(model, SPLITS, lane_count=2, ctx_size=128, stage_flags=flags)
    delayed_tokens, hops = _generate(delayed, prompts, flags)
    for stage_id in delayed.stage_ids[1:]:
        ready = next(e for e in delayed.events(stage_id) if e.get("event") == "ready")
        assert ready["wire_delay_ms"] == DELAY_MS, ready

    assert delayed_tokens == plain_tokens
    assert plain_tokens == reference_generate(plain, prompts, MAX_TOKENS)
    # one entry per batch (prefill + MAX_TOKENS - 1 decode steps per request), one hop per link
    assert len(hops) == len(prompts) * MAX_TOKENS
    assert all(len(h) == len(SPLITS) for h in hops), hops
    fastest = min(min(h) for h in hops)
    assert fastest >= DELAY_MS - TOLERANCE_MS, f"a hop took {fastest:.3f} ms < {DELAY_MS} ms: {hops}"
