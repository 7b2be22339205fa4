"""Verify windows through real stage processes: acceptance, rewind and exactness across 2 and 3 stages.

An oracle proposer drafts the unsplit model's own greedy continuation, optionally corrupted at a
fixed draft offset, so every window's outcome is known in advance: no corruption -> full accepts;
corruption at offset 0 -> early rejects; at offset 2 -> tail rejects. In all cases the committed
tokens must equal an unsplit replay of the same batches bitwise, and plain greedy decoding of the
same prompt (the tiny models' margins are checked), because a rejected draft is rewound on every
stage by the authoritative-position rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import (
    Pipeline,
    generate_then_release,
    random_prompt,
    reference_generate,
    run,
    running_driver,
)

from skippy.config.speculative import NgramConfig, NgramKind
from skippy.driver.speculative.draft_model import DraftModelProposerFactory
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.global_suffix import GlobalSuffixProposerFactory
from skippy.driver.speculative.ngram_cache import NgramCacheProposerFactory
from skippy.driver.speculative.suffix import SuffixProposerFactory
from skippy.driver.speculative.window import WindowStats
from skippy.protocol import Predictions
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.tokenizer import Tokenizer
from skippy.testing.reference_runs import replay_op_log

MAX_TOKENS = 24


class OracleProposer:
    """Drafts the reference continuation of the prompt it is first extended with."""

    def __init__(self, references: dict[tuple[int, ...], list[int]], corrupt_at: int | None) -> None:
        self.references = references
        self.corrupt_at = corrupt_at
        self.history: list[int] = []
        self.prompt_len = 0

    def extend(self, tokens: Sequence[int]) -> None:
        if not self.history:
            self.prompt_len = len(tokens)
        self.history.extend(tokens)

    def propose(self, max_tokens: int) -> list[int]:
        continuation = self.references[tuple(self.history[: self.prompt_len])]
        done = len(self.history) - self.prompt_len
        draft = list(continuation[done : done + max_tokens])
        if self.corrupt_at is not None and self.corrupt_at < len(draft):
            draft[self.corrupt_at] = (draft[self.corrupt_at] + 1) % 400 + 3  # a token the model did not pick
        return draft

    def close(self) -> None:
        pass


class OracleFactory:
    name = "oracle"
    runs_llama = False

    def __init__(self, references: dict[tuple[int, ...], list[int]], corrupt_at: int | None) -> None:
        self.references = references
        self.corrupt_at = corrupt_at

    def for_session(self, session_id: int) -> OracleProposer:
        return OracleProposer(self.references, self.corrupt_at)

    def close(self) -> None:
        pass


class FixedK:
    def __init__(self, k: int) -> None:
        self.k = k

    def choose(self, stats: WindowStats, active_sessions: int) -> int:
        return self.k


def _verify_with_oracle(pipe: Pipeline, prompts: list[list[int]], corrupt_at: int | None
                       ) -> tuple[list[list[int]], list[list[int]], list, Speculation]:
    """The prompts decoded with verify windows of 4 oracle drafts (the plain greedy run, corrupted at `corrupt_at`):
    (their tokens, the plain run's, the op log); checks the run equals its unsplit replay bitwise."""
    plain = reference_generate(pipe, prompts, MAX_TOKENS)
    speculation = Speculation(OracleFactory({tuple(p): c for p, c in zip(prompts, plain)}, corrupt_at), FixedK(4))

    async def body() -> tuple[list[list[int]], list]:
        async with running_driver(pipe, speculation=speculation) as driver:
            handles = [driver.submit(p, max_tokens=MAX_TOKENS) for p in prompts]
            done = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), 120)
            assert all(final.finish_reason == "length" for _, final in done), done
            return [tokens for tokens, _ in done], list(driver.recorder)

    got, op_log = run(body())
    chain = pipe.reference_chain()
    try:
        replayed = replay_op_log(chain, op_log)
    finally:
        chain.close()
    verify_windows = [w for kind, batch in op_log if kind == "batch" for w in batch if w[4]]
    assert verify_windows, "no verify window was sent"
    assert all(len(w[2]) == len(w[4]) + 1 and w[3] == tuple(range(len(w[2]))) for w in verify_windows)
    by_session = {w[0]: w for kind, batch in op_log if kind == "batch" for w in batch}
    assert sorted(replayed.get(s, [])[: MAX_TOKENS] for s in by_session) == sorted(got)
    assert speculation.totals.windows == len(verify_windows)
    return got, plain, op_log, speculation


@pytest.mark.parametrize(("splits", "corrupt_at", "expect"), [
    ([3], None, "full"), ([3], 0, "early"), ([2, 4], 2, "tail"), ([2, 4], None, "full"),
], ids=["2stage-full", "2stage-early", "3stage-tail", "3stage-full"])
def test_verify_windows_commit_exactly_what_plain_greedy_commits(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline], splits: list[int],
        corrupt_at: int | None, expect: str) -> None:
    pipe = make_pipeline(tiny_model("llama"), splits, lane_count=4, ctx_size=128)
    prompts = [random_prompt(10 + 3 * i, 70 + i, 400) for i in range(3)]
    got, plain, op_log, spec = _verify_with_oracle(pipe, prompts, corrupt_at)
    assert got == plain  # the tiny models' greedy margins are wide; the replay check is the bitwise one
    totals = spec.totals
    if expect == "full":
        assert totals.full_accepts == totals.windows and totals.accepted == totals.proposed
        assert len(op_log) < 3 * MAX_TOKENS  # far fewer batches than one per token per session
    elif expect == "early":
        assert totals.early_rejects == totals.windows and totals.accepted == 0
    else:  # a draft of 3+ tokens is corrupted at offset 2: exactly 2 accepted; shorter drafts are intact
        corrupted = sum(1 for kind, batch in op_log if kind == "batch" for w in batch if len(w[4]) >= 3)
        assert totals.tail_rejects == corrupted > 0 and totals.early_rejects == 0
        assert totals.full_accepts == totals.windows - corrupted


@pytest.mark.gemma
@pytest.mark.parametrize(("model", "splits"), [("qwen05b_path", [12]), ("qwen15b_path", [14])],
                         ids=["qwen05b", "qwen15b"])
def test_qwen_coder_verify_windows_equal_the_unsplit_replay(request: pytest.FixtureRequest,
                                                           make_pipeline: Callable[..., Pipeline], model: str,
                                                           splits: list[int]) -> None:
    """Real weights: windows with a draft token the model did not pick (offset 2) and intact ones, split in two."""
    pipe = make_pipeline(request.getfixturevalue(model), splits, lane_count=4, ctx_size=128)
    chain = pipe.reference_chain()
    try:
        tokenizer = Tokenizer(chain.stages[0].model)
        prompts = [tokenizer.encode(t) for t in ("def quicksort(xs):\n", "import os\n\ndef main():\n", "SELECT")]
    finally:
        chain.close()
    spec = _verify_with_oracle(pipe, prompts, 2)[3]
    assert spec.totals.tail_rejects > 0 and spec.totals.accepted > 0, spec.totals


def _prompts_whose_first_token_repeats_a_trigram(pipe: Pipeline, n: int) -> list[list[int]]:
    """Prompts `[a, b, t, filler.., q.., a, b]` whose greedy first token is t: the n-gram proposers then
    find the seed (a, b, t) earlier in the history at the first decode step and draft the filler."""
    chain = pipe.reference_chain()
    rng = np.random.default_rng(5)
    found: list[list[int]] = []
    try:
        for _ in range(200):
            q, filler, t = rng.integers(3, 400, 10).tolist(), rng.integers(3, 400, 6).tolist(), 3
            for _ in range(30):  # a fixed point of "t = first token after the prompt that starts with t"
                prompt = [q[-2], q[-1], t, *filler, *q]
                first = next(iter(chain.generate(prompt, 1)))
                if first == t:
                    found.append(prompt)
                    break
                t = first
            if len(found) == n:
                return found
    finally:
        chain.close()
    raise AssertionError(f"found {len(found)} of {n} prompts with a predictable first token")


def _run_with(pipe: Pipeline, speculation: Speculation, prompts: list[list[int]]) -> tuple[list[list[int]], list]:
    async def body() -> tuple[list[list[int]], list]:
        async with running_driver(pipe, speculation=speculation) as driver:
            handles = [driver.submit(p, max_tokens=MAX_TOKENS) for p in prompts]
            done = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), 60)
            return [tokens for tokens, _ in done], list(driver.recorder)

    return run(body())


def _replayed(pipe: Pipeline, op_log: list) -> list[list[int]]:
    chain = pipe.reference_chain()
    try:
        replayed = replay_op_log(chain, op_log)
    finally:
        chain.close()
    sessions = sorted({w[0] for kind, batch in op_log if kind == "batch" for w in batch})
    return [replayed[s][:MAX_TOKENS] for s in sessions]


@pytest.mark.parametrize("kind", ["suffix", "cache"])
def test_ngram_proposers_through_two_stages_equal_the_replay(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline], kind: str) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=4, ctx_size=128)
    prompts = _prompts_whose_first_token_repeats_a_trigram(pipe, 2)
    plain = reference_generate(pipe, prompts, MAX_TOKENS)
    ngram = NgramConfig(kind=NgramKind(kind), min_ngram=3 if kind == "suffix" else 1, max_ngram=4,
                        max_proposal_tokens=8)
    factory = SuffixProposerFactory(ngram) if kind == "suffix" else NgramCacheProposerFactory(ngram)
    speculation = Speculation(factory, FixedK(4))
    got, op_log = _run_with(pipe, speculation, prompts)
    assert speculation.totals.windows > 0, "the proposer never drafted"
    assert sorted(got) == sorted(_replayed(pipe, op_log))
    assert got == plain


def test_draft_model_pair_through_three_stages_equals_the_replay(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    target = tiny_model("llama")
    pipe = make_pipeline(target, [2, 4], lane_count=4, ctx_size=128)
    prompts = [random_prompt(9 + 4 * i, 30 + i, 400) for i in range(3)]
    plain = reference_generate(pipe, prompts, MAX_TOKENS)
    draft = DraftModelProposerFactory(tiny_model("qwen3", n_layer=2, seed=7), target_vocab_model=target, lane_count=4,
                                      ctx_size=128)
    speculation = Speculation(draft, FixedK(3))
    got, op_log = _run_with(pipe, speculation, prompts)
    assert speculation.totals.windows > 0 and speculation.totals.proposed > 0
    assert sorted(got) == sorted(_replayed(pipe, op_log))
    assert got == plain


@pytest.mark.parametrize(("corrupt_at", "expect_stale"), [(None, False), (2, True)], ids=["chain-holds", "chain-breaks"])
def test_pipelined_windows_discard_stale_ones_and_stay_exact(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline], corrupt_at: int | None,
        expect_stale: bool) -> None:
    """pipeline_depth 2: a window is chained behind the one in flight, its head guessing that one's bonus
    token. When the first window rejects a draft, the chained one is stale: the final stage samples
    nothing for it, stage 0 discards it, and the output still equals plain greedy and the replay."""
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=4, ctx_size=128)
    prompts = [random_prompt(11 + 5 * i, 90 + i, 400) for i in range(2)]
    plain = reference_generate(pipe, prompts, MAX_TOKENS)
    oracle = OracleFactory({tuple(p): c for p, c in zip(prompts, plain)}, corrupt_at)
    speculation = Speculation(oracle, FixedK(3), depth=2)

    async def body() -> tuple[list[list[int]], list]:
        async with running_driver(pipe, speculation=speculation, max_iterations=2) as driver:
            handles = [driver.submit(p, max_tokens=MAX_TOKENS) for p in prompts]
            done = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), 60)
            return [tokens for tokens, _ in done], list(driver.recorder)

    got, op_log = run(body())
    assert got == plain
    assert sorted(got) == sorted(_replayed(pipe, op_log))
    chained = [w for kind, batch in op_log if kind == "batch" for w in batch if w[5] is not None]
    assert chained, "no chained window was sent"
    totals = speculation.totals
    if expect_stale:
        assert totals.stale_windows > 0 and totals.stale_rows >= totals.stale_windows
    else:
        assert totals.stale_windows == 0 and totals.full_accepts == totals.windows


def test_seeded_sampling_with_verify_windows_reproduces_plain_sampling(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    """temperature 0.9 with a seed: the final stage samples verify rows with the session's own sampler, one
    draw per returned token, so the sampled continuation is plain sampling's (sample-and-compare keeps the
    target distribution; a seed stays reproducible), whichever drafts were right."""
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=4, ctx_size=128)
    prompts = [random_prompt(14 + 3 * i, 50 + i, 400) for i in range(2)]
    sampling = SamplingParams(temperature=0.9, top_k=40, seed=1234)

    async def generate(speculation: Speculation | None) -> tuple[list[list[int]], list]:
        async with running_driver(pipe, speculation=speculation) as driver:
            handles = [driver.submit(p, sampling, max_tokens=MAX_TOKENS) for p in prompts]
            done = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), 60)
            return [tokens for tokens, _ in done], list(driver.recorder)

    plain, _ = run(generate(None))
    assert plain != reference_generate(pipe, prompts, MAX_TOKENS)  # sampling, not greedy
    speculation = Speculation(OracleFactory({tuple(p): c for p, c in zip(prompts, plain)}, 1), FixedK(4))
    got, op_log = run(generate(speculation))
    assert got == plain
    assert speculation.totals.tail_rejects > 0 and speculation.totals.accepted > 0
    chain = pipe.reference_chain()
    try:
        sessions = sorted({w[0] for kind, batch in op_log if kind == "batch" for w in batch})
        replayed = replay_op_log(chain, op_log, {s: sampling for s in sessions})
    finally:
        chain.close()
    assert sorted(replayed[s][:MAX_TOKENS] for s in sessions) == sorted(got)


def test_a_repeated_request_drafts_from_the_global_index_and_stays_exact(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    """Drafting across requests: the first request's prompt and output join the global suffix index when its
    session is released; the same request again gets its drafts from there (its own history, the prompt,
    has nothing to match), decodes in far fewer steps, and its output is still plain greedy's."""
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=4, ctx_size=128)
    prompt = random_prompt(12, 321, 400)
    plain = reference_generate(pipe, [prompt], MAX_TOKENS)[0]
    factory = GlobalSuffixProposerFactory(NgramConfig(kind=NgramKind.SUFFIX, min_ngram=3, max_ngram=8,
                                                      max_proposal_tokens=8), 4096)
    speculation = Speculation(factory, FixedK(4))

    async def body() -> tuple[list[int], list[int], list, float]:
        async with running_driver(pipe, speculation=speculation) as driver:
            first = await generate_then_release(driver, speculation, prompt, MAX_TOKENS)
            from_index = factory.index.registry.get_sample_value("skippy_speculative_global_proposed_tokens_total")
            second, _ = await asyncio.wait_for(driver.submit(prompt, max_tokens=MAX_TOKENS).collect(), 60)
            return first, second, list(driver.recorder), from_index or 0.0

    first, second, op_log, from_index_before = run(body())
    assert first == second == plain
    assert factory.index.tokens_held == len(prompt) + MAX_TOKENS  # the first session (the second: pending)
    assert [len(tokens) for tokens in factory.index.pending] == [len(prompt) + MAX_TOKENS]
    from_index = factory.index.registry.get_sample_value("skippy_speculative_global_proposed_tokens_total")
    assert from_index is not None and from_index - from_index_before >= MAX_TOKENS // 2
    steps: dict[int, int] = {}
    for kind, batch in op_log:
        for window in batch if kind == "batch" else ():
            steps[window[0]] = steps.get(window[0], 0) + 1
    first_steps, second_steps = (steps[s] for s in sorted(steps))
    assert 3 * second_steps <= first_steps, steps  # >= 3x fewer decode steps for the repeat
    assert sorted(_replayed(pipe, op_log)) == sorted([first, second])


def test_only_batches_launched_alone_time_the_hops(tiny_model: Callable[..., Path],
                                                   make_pipeline: Callable[..., Pipeline]) -> None:
    """The policy's hop delay comes from decode batches that had nothing in flight ahead of them: a prompt's
    pipelined prefill chunks wait behind each other at every stage, and their `recv_at - sent_at` (up to
    3.2 s measured behind 2048-row chunks) once priced the wire so high that drafting looked to pay at c=16."""
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=256)
    prompt = random_prompt(112, 77, 400)
    flags = ("--openai-prefill-chunk-policy", "fixed", "--openai-prefill-chunk-size", "16",
             "--downstream-wire-delay-ms", "30")
    speculation = Speculation(SuffixProposerFactory(NgramConfig(kind=NgramKind.SUFFIX, min_ngram=2, max_ngram=4,
                                                                max_proposal_tokens=4)), FixedK(2))
    timed: list[list[float]] = []
    launched: list[tuple[int, bool]] = []  # (batches ahead at launch, has prefill rows) of every batch back
    observe_hops = speculation.observe_hops

    def record_hops(hop_ms: Sequence[float]) -> None:
        timed.append(list(hop_ms))
        observe_hops(hop_ms)

    speculation.observe_hops = record_hops  # type: ignore[method-assign]

    async def body() -> None:
        async with running_driver(pipe, *flags, max_iterations=1, speculation=speculation) as driver:
            original = driver.on_predictions

            def record(msg: Predictions) -> None:
                entry = driver.launcher.inflight.get(msg.batch_id)
                if entry is not None:
                    launched.append((entry.ahead, any(pw.is_prefill for pw in entry.plan)))
                original(msg)

            driver.on_predictions = record  # type: ignore[method-assign]
            _, final = await asyncio.wait_for(driver.submit(prompt, max_tokens=12).collect(), 60)
            assert final.finish_reason == "length"

    run(body())
    assert any(ahead > 0 for ahead, _ in launched), launched  # the chunks did queue behind each other
    alone = [ahead == 0 and not prefill for ahead, prefill in launched]
    assert len(timed) == sum(alone) > 0, launched
    assert all(len(hops) == 1 for hops in timed)  # one hop: stage 0 -> stage 1
