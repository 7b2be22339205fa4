"""Native MTP drafting at the final stage (skippy.runtime.mtp) on the tiny mimo2 model with a NextN block.

Integrated: the final slice carries the NextN block and drafts from the trunk's hidden states; greedy
decoding that verifies those drafts equals plain decoding, unsplit and across 2 and 3 stages, and accepts of
each window's drafts exactly those that plain decoding goes on with. The drafts themselves do not depend on
the split. External: a trunk-only GGUF plus the MTP-only sidecar drafts exactly what the integrated model does
(the same weights);
a sidecar whose n_embd differs is refused naming both files; a trunk without NextN tensors runs on, no drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from runtime_helpers import prompt_tokens, tiny_spec

from skippy.runtime.chain import LocalChain
from skippy.runtime.errors import ModelError
from skippy.runtime.stage_runtime import StageRuntime
from skippy.testing.reference_runs import MtpRun, mtp_greedy

PROMPT = prompt_tokens(40, seed=3)
STEPS = 24
N_DRAFT = 3


def speculative_greedy(chain: LocalChain, steps: int, n_draft: int) -> MtpRun:
    return mtp_greedy(chain, PROMPT, steps, n_draft)


def continued_by(run: MtpRun, plain: list[int]) -> list[int]:
    """Per verify window of `run`, how many of its drafts (from the first) plain decoding goes on with there."""
    counts, done = [], 1  # the prompt's prefill gives the first token
    for drafts, accepted in zip(run.drafts, run.accepted):
        follow = plain[done:done + len(drafts)]
        assert len(follow) == len(drafts), "plain decoding too short to check this window"
        counts.append(next((i for i, (d, p) in enumerate(zip(drafts, follow)) if d != p), len(drafts)))
        done += accepted + 1
    return counts


@pytest.fixture(scope="module")
def chains(tiny_model: Callable[..., Path]) -> Iterator[Callable[..., LocalChain]]:
    made: dict[tuple[object, ...], LocalChain] = {}

    def get(*split: int, mtp: str = "integrated", path: Path | None = None, sidecar: Path | None = None) -> LocalChain:
        key = (split, mtp, path, sidecar)
        if key not in made:
            spec = tiny_spec(path or tiny_model("mtp"), mtp=mtp, mtp_draft_model=sidecar)
            made[key] = LocalChain(spec, split)
        return made[key]

    yield get
    for chain in made.values():
        chain.close()


def test_plain_chain_loads_no_mtp(chains: Callable[..., LocalChain]) -> None:
    chain = chains(mtp="disabled")
    assert chain.final.mtp is None and chain.final.mtp_off == ""
    assert chain.final.mtp_draft(0, 5, 3, N_DRAFT) == ()


@pytest.mark.parametrize("split", [(), (3,), (2, 4)], ids=["unsplit", "2-stages", "3-stages"])
def test_greedy_with_mtp_drafts_equals_plain(split: tuple[int, ...], chains: Callable[..., LocalChain]) -> None:
    plain = list(chains(mtp="disabled").generate(PROMPT, STEPS + N_DRAFT + 1))  # past the last window's drafts
    assert len(set(plain)) > 6, "degenerate continuation: the comparison would prove little"
    run = speculative_greedy(chains(*split), STEPS, N_DRAFT)
    assert run.tokens == plain[:STEPS]
    assert run.drafted >= N_DRAFT * 3
    expected = continued_by(run, plain)
    assert sum(expected) > 0, "no draft goes on as plain decoding does: acceptance would be untested"
    assert run.accepted == expected  # every draft plain decoding goes on with, up to the first it does not
    assert all(not s.mtp for s in chains(*split).stages[:-1])  # only the final stage drafts


def test_drafts_do_not_depend_on_the_split(chains: Callable[..., LocalChain]) -> None:
    """The NextN block sees the same hidden states and tokens whatever the split (split == unsplit bitwise):
    the same drafts in every window, the same accepted, the same tokens."""
    runs = [speculative_greedy(chains(*split), 8, N_DRAFT) for split in [(), (3,), (2, 4)]]
    assert any(runs[0].drafts)
    assert runs[0].drafts == runs[1].drafts == runs[2].drafts
    assert runs[0] == runs[1] == runs[2]


def test_external_sidecar_drafts_what_the_integrated_block_does(
    tiny_model: Callable[..., Path], chains: Callable[..., LocalChain],
) -> None:
    trunk, sidecar = tiny_model("mtp", part="trunk"), tiny_model("mtp", part="mtp")
    external = chains(3, mtp="external", path=trunk, sidecar=sidecar)
    assert external.final.mtp is not None and external.final.mtp.model.path == sidecar
    sidecar_run, integrated_run = speculative_greedy(external, 12, N_DRAFT), speculative_greedy(chains(3), 12, N_DRAFT)
    assert any(integrated_run.drafts) and sidecar_run.drafts == integrated_run.drafts
    assert sidecar_run == integrated_run


def test_a_sidecar_that_does_not_fit_is_refused_naming_both_files(tiny_model: Callable[..., Path]) -> None:
    trunk = tiny_model("mtp", part="trunk")
    narrow = tiny_model("mtp", part="mtp", n_embd=32)
    with pytest.raises(ModelError, match=r"mtp-draft-model-path .*n_embd 32, not 64") as refused:
        StageRuntime(replace(tiny_spec(trunk, mtp="external", mtp_draft_model=narrow), layer_end=6))
    assert str(narrow) in str(refused.value) and str(trunk) in str(refused.value)


def test_a_final_stage_without_nextn_tensors_runs_on_without_drafts(
    tiny_model: Callable[..., Path], chains: Callable[..., LocalChain],
) -> None:
    chain = chains(3, path=tiny_model("mtp", part="trunk"))
    assert chain.final.mtp is None and "no NextN (MTP) layers" in chain.final.mtp_off
    run = speculative_greedy(chain, 8, N_DRAFT)
    assert run.drafted == 0 and run.tokens == list(chains(mtp="disabled").generate(PROMPT, 8))
