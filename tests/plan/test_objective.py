"""The planner's objectives (`--plan-for`) on synthetic cost tables: fast, deterministic, no model.

A prompt's chunks run through the layers only (one row through the head), so a split chosen for prefill balances
the layers where one chosen for decode puts fewer layers with the head; the search finds the best split for each
objective (checked against brute force); mixed weighs both; replicas never speed up one prompt's prefill; the
prediction pipelines a prompt's chunks (after the first chunk's trip, one chunk per busiest stage's chunk time).
"""

from __future__ import annotations

import itertools
import math

import pytest
from plan_helpers import N_LAYER, SHAPE, costs, facts

from skippy.cli.main import build_parser
from skippy.cli.plan import objective_of
from skippy.config.errors import ConfigError
from skippy.plan.costs import ComputeCosts, Overheads
from skippy.plan.hosts import Host
from skippy.plan.objective import Objective
from skippy.plan.plan import plan_from_costs
from skippy.plan.predict import PREFILL_CHUNK_ROWS, StageCost, prefill_ms
from skippy.plan.search import best_splits

PROMPT = 4096
PREFILL = Objective("prefill", prompt_tokens=PROMPT)
MIXED = Objective("mixed", prompt_tokens=PROMPT, reply_tokens=256)


def two_hosts(speed_b: float = 1.0) -> list[tuple[Host, ComputeCosts]]:
    return [(Host("a", cpus="0"), costs(1.0)), (Host("b", cpus="1"), costs(speed_b))]


def layers(split: tuple[StageCost, ...]) -> list[int]:
    return [s.end - s.start for s in split]


def test_a_prefill_split_balances_the_layers_a_decode_split_does_not() -> None:
    f = facts()
    decode, prefill = (best_splits(two_hosts(), f, SHAPE, 16, objective=o)[2] for o in (Objective(), PREFILL))
    assert decode is not None and prefill is not None
    assert layers(decode.stages)[1] < layers(decode.stages)[0]  # the head stage gets fewer layers for decode rounds
    assert layers(prefill.stages) == [N_LAYER // 2, N_LAYER // 2]  # a chunk barely touches the head
    one_host = prefill_ms((StageCost(Host("a"), costs(), 0, N_LAYER),), PROMPT, f.n_embd)
    assert prefill_ms(prefill.stages, PROMPT, f.n_embd) < prefill_ms(decode.stages, PROMPT, f.n_embd)
    assert prefill_ms(prefill.stages, PROMPT, f.n_embd) < 0.55 * one_host  # two stages nearly halve a long prompt


def test_the_prefill_prediction_pipelines_the_chunks() -> None:
    f, o = facts(), Overheads()
    half = (StageCost(Host("a", delay_ms=5.0), costs(), 0, 6), StageCost(Host("b"), costs(), 6, N_LAYER))
    chunk = [s.costs.chunk_ms(s.start, s.end, PREFILL_CHUNK_ROWS) + o.stage_ms for s in half]
    head = costs().head_ms[0]  # one row
    trip = sum(chunk) + o.hop_ms + 5.0 + o.return_ms
    expected = trip + (math.ceil(PROMPT / PREFILL_CHUNK_ROWS) - 1) * max(chunk) + head
    assert prefill_ms(half, PROMPT, f.n_embd, o) == pytest.approx(expected)


@pytest.mark.parametrize("objective", [PREFILL, MIXED], ids=["prefill", "mixed"])
@pytest.mark.parametrize("speed_b", [1.0, 0.6])
def test_the_search_finds_the_brute_force_optimum(objective: Objective, speed_b: float) -> None:
    f = facts()
    hosts = [*two_hosts(speed_b), (Host("c", cpus="2", delay_ms=10.0), costs(1.4))]
    splits = best_splits(hosts, f, SHAPE, 4, objective=objective)
    for k, split in splits.items():
        assert split is not None
        best = min(objective.score([StageCost(hosts[h][0], hosts[h][1], e[i], e[i + 1]) for i, h in enumerate(chosen)],
                                   4, f.n_embd)
                   for chosen in itertools.combinations(range(len(hosts)), k)
                   for cuts in itertools.combinations(range(1, N_LAYER), k - 1) for e in [[0, *cuts, N_LAYER]])
        assert objective.score(split.stages, 4, f.n_embd) == pytest.approx(best)


def test_mixed_weighs_the_prefill_and_the_answer() -> None:
    f = facts()
    chosen = {name: best_splits(two_hosts(), f, SHAPE, 16, objective=o)[2]
              for name, o in (("decode", Objective()), ("prefill", PREFILL), ("mixed", MIXED))}
    assert all(s is not None for s in chosen.values())
    scores = {name: MIXED.score(s.stages, 16, f.n_embd) for name, s in chosen.items() if s is not None}
    assert scores["mixed"] <= min(scores["decode"], scores["prefill"])
    short_answer = Objective("mixed", prompt_tokens=PROMPT, reply_tokens=1)
    mostly_prompt = best_splits(two_hosts(), f, SHAPE, 16, objective=short_answer)[2]
    assert mostly_prompt is not None and layers(mostly_prompt.stages) == [N_LAYER // 2, N_LAYER // 2]


def test_replicas_do_not_serve_a_prefill_plan_and_the_report_says_what_it_is_for() -> None:
    f = facts()
    decode = plan_from_costs(two_hosts(), f, SHAPE, 16)
    prefill = plan_from_costs(two_hosts(), f, SHAPE, 16, objective=PREFILL)
    assert decode.replicated  # at 16 streams a whole model per core beats any split (test_replicas)
    assert not prefill.replicated and len(prefill.chosen.stages) == 2  # one prompt runs on one replica
    report = prefill.report()
    assert f"plan, chosen for the shortest prefill of a {PROMPT}-token prompt: 2 stage(s)" in report
    assert f"predicted prefill of a {PROMPT}-token prompt: this plan " in report and "a alone" in report


def test_the_flags_make_the_objective_and_bad_values_are_refused_by_name() -> None:
    parse = build_parser().parse_args
    assert objective_of(parse(["plan", "--stage-cpus", "0,1"])) == Objective("mixed")  # an agent's request by default
    assert objective_of(parse(["plan", "--stage-cpus", "0,1", "--plan-for", "mixed", "--plan-prompt-tokens", "20000",
                               "--plan-reply-tokens", "64"])) == Objective("mixed", 20000, 64)
    for flag in ("--plan-prompt-tokens", "--plan-reply-tokens"):
        with pytest.raises(ConfigError, match=f"^{flag} must be >= 1, got 0$"):
            objective_of(parse(["plan", "--plan-for", "mixed", flag, "0"]))
    with pytest.raises(SystemExit):  # argparse names the choices
        parse(["plan", "--plan-for", "throughput"])
