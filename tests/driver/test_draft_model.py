"""The draft-model proposer: a tiny draft for a tiny target sharing its vocabulary, the vocabulary refusal,
and the Gemma model as its own draft.

The reference for a proposal is the draft model's own greedy continuation, decoded alone on an unsplit
LocalChain. llama.cpp is not batch-invariant (a catch-up chunk is a different batch shape than a full
prefill), so proposals are compared with it token by token up to the first thin top-2 margin; sessions
interleaved on one draft context are compared bitwise with the same operations run alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from skippy.driver.speculative import Proposer, ProposerFactory
from skippy.driver.speculative.draft_model import DraftModelProposerFactory, vocab_mismatch
from skippy.runtime.chain import LocalChain
from skippy.runtime.errors import ModelError, RuntimeUsageError
from skippy.runtime.llama_model import LlamaModel
from skippy.runtime.slices import ensure_slice
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.tokenizer import Tokenizer
from skippy.testing.reference_runs import check_against_alone, clear_prefix, greedy_with_margins
from skippy.testing.tiny_models import _vocab

CTX = 128
K = 8
TINY_MARGIN = 0.01  # f32 tiny models: only near-ties may flip between batch shapes
GEMMA_MARGIN = 0.5  # the rule for Gemma


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 400, n).tolist()


@pytest.fixture(scope="module")
def target_path(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("llama", n_layer=4)


@pytest.fixture(scope="module")
def draft_path(tiny_model: Callable[..., Path]) -> Path:
    """Another family, depth and weight seed: only the vocabulary is shared with the target."""
    return tiny_model("qwen3", n_layer=2, seed=7)


@pytest.fixture(scope="module")
def draft_chain(draft_path: Path) -> Iterator[LocalChain]:
    chain = LocalChain(RuntimeSpec(model_path=draft_path, layer_start=0, layer_end=0, ctx_size=CTX, lane_count=1))
    yield chain
    chain.close()


@pytest.fixture
def make_factory(draft_path: Path, target_path: Path) -> Iterator[Callable[..., DraftModelProposerFactory]]:
    made: list[DraftModelProposerFactory] = []

    def make(lane_count: int = 3) -> DraftModelProposerFactory:
        factory = DraftModelProposerFactory(draft_path, target_vocab_model=target_path, lane_count=lane_count, ctx_size=CTX)
        made.append(factory)
        return factory

    yield make
    for factory in made:
        factory.close()


def assert_greedy(chain: LocalChain, history: list[int], got: list[int], min_margin: float = TINY_MARGIN) -> int:
    """`got` is the chain's greedy continuation of `history` (up to thin margins); returns positions compared."""
    ref, margins = greedy_with_margins(chain, history, len(got))
    compared, problem = check_against_alone(got, ref, margins, min_margin)
    assert problem is None, problem
    assert compared >= clear_prefix(margins, min_margin)
    return compared


def test_proposals_are_the_drafts_greedy_continuation(
    make_factory: Callable[..., DraftModelProposerFactory], draft_chain: LocalChain,
) -> None:
    factory: ProposerFactory = make_factory()
    assert factory.name == "draft-model"
    proposer = factory.for_session(1)
    assert proposer.propose(K) == []  # nothing to continue yet
    history = prompt(20, seed=1)
    proposer.extend(history[:12])
    proposer.extend(history[12:])  # the history may arrive in pieces
    drafts = proposer.propose(K)
    assert len(drafts) == K
    assert assert_greedy(draft_chain, history, drafts) == K
    assert proposer.propose(K) == drafts  # the drafts were trimmed from the KV, the answer is the same
    assert proposer.propose(3) == drafts[:3]
    assert proposer.propose(0) == []


@pytest.mark.parametrize("accepted", [0, 3, K])
def test_extend_after_propose_continues_from_the_committed_history(
    accepted: int, make_factory: Callable[..., DraftModelProposerFactory], draft_chain: LocalChain,
) -> None:
    proposer = make_factory().for_session(5)
    history = prompt(17, seed=2)
    proposer.extend(history)
    drafts = proposer.propose(K)
    # the target accepts a prefix, then commits its own token (never the draft's next one)
    committed = drafts[:accepted] + ([] if accepted == K else [(drafts[accepted] + 1) % 400 + 3])
    proposer.extend(committed)
    history += committed
    again = proposer.propose(K)
    assert assert_greedy(draft_chain, history, again) > 0
    proposer.extend(again[:2])
    assert assert_greedy(draft_chain, history + again[:2], proposer.propose(K)) > 0


Step = tuple[str, list[int] | int]  # (session, tokens to extend with | max_tokens to propose)


def _script(proposers: dict[str, Proposer], steps: list[Step]) -> list[tuple[str, list[int]]]:
    """Run the steps in order; returns every (session, proposal)."""
    out: list[tuple[str, list[int]]] = []
    for name, arg in steps:
        if isinstance(arg, list):
            proposers[name].extend(arg)
        else:
            out.append((name, proposers[name].propose(arg)))
    return out


def test_interleaved_sessions_equal_each_alone(
    make_factory: Callable[..., DraftModelProposerFactory], draft_chain: LocalChain,
) -> None:
    prompts = {"a": prompt(9, seed=3), "b": prompt(30, seed=4), "c": prompt(4, seed=5)}
    steps: list[Step] = [
        ("a", prompts["a"]), ("a", K), ("b", prompts["b"]), ("b", 4), ("a", [17, 42]), ("c", prompts["c"]),
        ("a", K), ("c", K), ("b", [99]), ("b", K), ("c", [7, 8, 9]), ("a", 2), ("c", K),
    ]
    shared = make_factory(lane_count=3)
    together = _script({name: shared.for_session(i) for i, name in enumerate(prompts)}, steps)
    for name in prompts:
        alone = _script({name: make_factory(lane_count=1).for_session(0)}, [s for s in steps if s[0] == name])
        assert [t for t in together if t[0] == name] == alone  # bitwise: same batches, other lanes busy or not
    assert len({tuple(p) for _, p in together}) > 3  # different sessions, different drafts
    # and each session's first proposal is the draft model's own greedy continuation
    assert assert_greedy(draft_chain, prompts["a"], together[0][1]) > 0
    assert assert_greedy(draft_chain, prompts["b"], together[1][1]) > 0


def test_lanes_are_freed_on_close(make_factory: Callable[..., DraftModelProposerFactory], draft_chain: LocalChain) -> None:
    factory = make_factory(lane_count=2)
    first, second = factory.for_session(1), factory.for_session(2)
    with pytest.raises(RuntimeUsageError, match="already has"):
        factory.for_session(2)
    with pytest.raises(RuntimeUsageError, match="all 2 draft-model lanes are busy"):
        factory.for_session(3)
    first.extend(prompt(40, seed=6))
    first.propose(K)
    first.close()
    first.close()  # idempotent
    with pytest.raises(RuntimeUsageError, match="closed"):
        first.propose(K)
    assert factory.free_lanes == 1
    third = factory.for_session(3)  # reuses the first session's lane, which must hold nothing of it
    history = prompt(6, seed=7)
    third.extend(history)
    assert assert_greedy(draft_chain, history, third.propose(K)) > 0
    second.close()
    third.close()
    assert factory.free_lanes == 2


def test_drafts_stop_at_the_context_and_bad_tokens_are_refused(make_factory: Callable[..., DraftModelProposerFactory]) -> None:
    proposer = make_factory().for_session(0)
    proposer.extend(prompt(CTX - 3, seed=8))
    assert len(proposer.propose(K)) == 3  # the target could not verify drafts past its context
    proposer.extend([5, 6, 7])
    assert proposer.propose(K) == []
    with pytest.raises(RuntimeUsageError, match="outside the vocabulary"):
        proposer.extend([10**6])


def test_vocabulary_mismatch_is_refused(tiny_model: Callable[..., Path], target_path: Path) -> None:
    shuffled = tiny_model("qwen3", n_layer=2, vocab_seed=1)
    tokens, shuffled_tokens = _vocab()[0], _vocab(vocab_seed=1)[0]
    first = next(i for i, (a, b) in enumerate(zip(tokens, shuffled_tokens)) if a != b)
    with pytest.raises(ModelError) as refused:
        DraftModelProposerFactory(shuffled, target_vocab_model=target_path, lane_count=1, ctx_size=CTX)
    message = str(refused.value)
    assert str(shuffled) in message and str(target_path) in message
    assert f"token id {first} is {shuffled_tokens[first]!r} in the draft, {tokens[first]!r} in the target" in message

    bigger = tiny_model("llama", n_layer=2, n_extra_tokens=5)
    with pytest.raises(ModelError, match=f"the draft has {len(tokens) + 5} tokens, the target {len(tokens)}"):
        DraftModelProposerFactory(bigger, target_vocab_model=target_path, lane_count=1, ctx_size=CTX)



def test_stage0_slice_gives_the_targets_vocabulary(
    draft_path: Path, target_path: Path, tiny_model: Callable[..., Path],
) -> None:
    """Stage 0 passes its loaded model, a slice of the target: it carries the whole vocabulary."""
    stage0 = LlamaModel(ensure_slice(target_path, 0, 2, final=False), vocab_only=True)
    shuffled = LlamaModel(tiny_model("qwen3", n_layer=2, vocab_seed=1), vocab_only=True)
    try:
        assert stage0.n_vocab == len(_vocab()[0])
        DraftModelProposerFactory(draft_path, target_vocab_model=stage0, lane_count=1, ctx_size=CTX).close()
        assert stage0.ptr is not None  # the caller's model is compared, not closed
        assert vocab_mismatch(shuffled, stage0) is not None
    finally:
        stage0.close()
        shuffled.close()


@pytest.mark.gemma
def test_gemma_as_its_own_draft_proposes_its_greedy_continuation(gemma_path: Path) -> None:
    chain = LocalChain(RuntimeSpec(model_path=gemma_path, layer_start=0, layer_end=0, ctx_size=256, lane_count=1))
    factory = DraftModelProposerFactory(gemma_path, target_vocab_model=gemma_path, lane_count=2, ctx_size=256)
    try:
        tokenizer = Tokenizer(chain.final.model)
        # code re-emission, the draft's use case: the first 11 greedy tokens have margins above 2.6
        history = tokenizer.encode("def add(a, b):\n    return a + b\n\n"
                                   "# The same function renamed to plus, otherwise unchanged:\ndef plus(")
        proposer = factory.for_session(0)
        proposer.extend(history)
        drafts = proposer.propose(K)
        assert assert_greedy(chain, history, drafts, GEMMA_MARGIN) == K
        proposer.extend(drafts[:5])  # accept five, then draft on from there
        assert assert_greedy(chain, history + drafts[:5], proposer.propose(K), GEMMA_MARGIN) >= 4
    finally:
        factory.close()
        chain.close()
