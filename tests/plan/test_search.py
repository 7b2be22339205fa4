"""The planner's algorithm on synthetic cost tables: fast, deterministic, no model.

A 12-layer model whose head costs as much as `head` layers, on hosts with given speeds, memory and
links. The DP's choice is checked against brute force over every split, and against what the model
must say: put fewer layers with the head, never exceed a host's memory, "don't split" when one host is
faster, name the host whose memory forces a split, and prefer one host for single-stream latency.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from plan_helpers import N_LAYER, SHAPE, costs, facts

from skippy.config.errors import ConfigError
from skippy.plan.costs import ComputeCosts, Overheads, interpolate
from skippy.plan.hosts import Host
from skippy.plan.memory import MIB, ModelFacts, stage_memory
from skippy.plan.plan import Plan
from skippy.plan.predict import StageCost, predict, shared_cores
from skippy.plan.search import best_splits


def brute_force(hosts: list[tuple[Host, ComputeCosts]], k: int, concurrency: int, f: ModelFacts) -> float:
    best = float("inf")
    for chosen in itertools.combinations(range(len(hosts)), k):
        for cuts in itertools.combinations(range(1, N_LAYER), k - 1):
            edges = [0, *cuts, N_LAYER]
            stages = [StageCost(hosts[h][0], hosts[h][1], edges[i], edges[i + 1]) for i, h in enumerate(chosen)]
            if any(s.host.mem_bytes is not None and stage_memory(f, s.start, s.end, SHAPE).total > s.host.mem_bytes
                   for s in stages):
                continue
            best = min(best, predict(stages, concurrency, f.n_embd).tpot_ms)
    return best


def test_interpolation_is_linear_between_and_past_the_measured_rows() -> None:
    assert interpolate((1, 4, 16), (1.0, 4.0, 10.0), 2.5) == pytest.approx(2.5)
    assert interpolate((1, 4, 16), (1.0, 4.0, 10.0), 10) == pytest.approx(7.0)
    assert interpolate((1, 4, 16), (1.0, 4.0, 10.0), 32) == pytest.approx(18.0)


@pytest.mark.parametrize("concurrency", [1, 4, 16])
@pytest.mark.parametrize("delay_ms", [0.0, 20.0])
def test_the_dp_finds_the_brute_force_optimum(concurrency: int, delay_ms: float) -> None:
    f = facts()
    hosts = [(Host("a", delay_ms=delay_ms, mbps=100), costs(1.0)), (Host("b", delay_ms=delay_ms), costs(0.7)),
             (Host("c", mem_mb=200, delay_ms=delay_ms), costs(1.3))]
    splits = best_splits(hosts, f, SHAPE, concurrency)
    for k, split in splits.items():
        assert split is not None
        assert split.prediction.tpot_ms == pytest.approx(brute_force(hosts, k, concurrency, f))


@pytest.mark.parametrize("concurrency", [1, 4, 16])
@pytest.mark.parametrize("cpus", [["0", "1", "0"], ["0-1", "1", "2"], ["0", "0", "1"]])
def test_the_search_adds_up_stages_that_share_cores(concurrency: int, cpus: list[str]) -> None:
    """Hosts standing for overlapping CPU sets of this machine (`--stage-cpus 0,1,0`) are one resource: the
    search must score a split as the prediction does, not as if each stage had its cores to itself."""
    f = facts()
    hosts = [(Host(f"h{i}", cpus=c), costs(1.0)) for i, c in enumerate(cpus)]
    splits = best_splits(hosts, f, SHAPE, concurrency)
    for k, split in splits.items():
        assert split is not None
        assert split.prediction.tpot_ms == pytest.approx(brute_force(hosts, k, concurrency, f))


def test_the_head_stage_gets_fewer_layers() -> None:
    split = best_splits([(Host("a"), costs()), (Host("b"), costs())], facts(), SHAPE, 16)[2]
    assert split is not None
    first, final = split.stages
    assert final.end - final.start < first.end - first.start
    # an even split would be slower
    even = (StageCost(first.host, first.costs, 0, 6), StageCost(final.host, final.costs, 6, N_LAYER))
    assert predict(even, 16, 512).tpot_ms > split.prediction.tpot_ms


def test_memory_budgets_are_kept_and_the_small_host_is_named() -> None:
    f = facts(head_mib=100)
    whole = stage_memory(f, 0, N_LAYER, SHAPE).total
    budget_mb = (whole - 20 * MIB) / MIB  # a little less than the whole model needs
    hosts = [Host("small1", mem_mb=budget_mb), Host("small2", mem_mb=budget_mb)]
    table = [(h, costs()) for h in hosts]
    splits = best_splits(table, f, SHAPE, 1)
    assert splits[1] is None  # no host holds it alone
    split = splits[2]
    assert split is not None
    assert all(m.total <= budget_mb * MIB for m in split.memory)
    plan = Plan(f, SHAPE, 1, split, splits, tuple(hosts), whole)
    assert "a split is necessary" in plan.verdict() and "small1" in plan.verdict()


def test_dont_split_when_one_host_is_faster() -> None:
    # a fast host with room for everything, a slow one behind a 50 ms link: splitting only costs
    hosts = [(Host("fast"), costs(0.5)), (Host("slow", delay_ms=50.0), costs(3.0))]
    f = facts()
    splits = best_splits(hosts, f, SHAPE, 4)
    assert splits[1] is not None and splits[2] is not None
    assert splits[1].prediction.tpot_ms < splits[2].prediction.tpot_ms
    plan = Plan(f, SHAPE, 4, splits[1], splits, (), stage_memory(f, 0, N_LAYER, SHAPE).total)
    assert plan.verdict().startswith("don't split: fast holds the whole model")


def test_latency_prefers_one_host_and_throughput_two() -> None:
    f = facts()
    latency = best_splits([(Host("a", delay_ms=5.0), costs()), (Host("b", delay_ms=5.0), costs())], f, SHAPE, 1)
    throughput = best_splits([(Host("a"), costs()), (Host("b"), costs())], f, SHAPE, 16)
    assert latency[1] is not None and latency[2] is not None and throughput[1] is not None and throughput[2] is not None
    assert latency[1].prediction.tpot_ms < latency[2].prediction.tpot_ms  # hops only add at one stream
    assert throughput[2].prediction.tok_s > 1.3 * throughput[1].prediction.tok_s  # two hosts compute at once


def test_a_slow_links_rate_is_a_bottleneck() -> None:
    slow = Host("a", mbps=1.0)  # a micro-batch of 8 rows x 512 x 4 bytes = 16 KiB: 131 ms at 1 Mbit/s
    stages = (StageCost(slow, costs(), 0, 6), StageCost(Host("b"), costs(), 6, N_LAYER))
    assert predict(stages, 16, 512).tpot_ms == pytest.approx(2 * 8 * 512 * 4 * 8 / 1e3)  # two batches per round


def test_overheads_count_once_per_hop() -> None:
    stages = (StageCost(Host("a", delay_ms=20.0), costs(), 0, 6), StageCost(Host("b", delay_ms=20.0), costs(), 6, N_LAYER))
    o = Overheads()
    compute = sum(s.costs.stage_ms(s.start, s.end, 1) + o.stage_ms for s in stages)
    assert predict(stages, 1, 512, o).tpot_ms == pytest.approx(compute + o.hop_ms + 20.0 + o.return_ms + 20.0)


def test_hosts_file_errors_name_the_field(tmp_path: Path) -> None:
    from skippy.plan.hosts import load_hosts

    bad = tmp_path / "hosts.json"
    bad.write_text('{"hosts": [{"name": "a", "memory": 3}]}')
    with pytest.raises(ConfigError, match=r"hosts\[0\]\.memory is not a host field"):
        load_hosts(bad)
    bad.write_text('[{"name": "a", "mem_mb": -1}]')
    with pytest.raises(ConfigError, match="mem_mb"):
        load_hosts(bad)
    bad.write_text('[{"name": "a", "cpus": 0, "mem_mb": 300}, {"address": "10.0.0.2"}]')
    assert [(h.name, h.cpus, h.mem_mb) for h in load_hosts(bad)] == [("a", "0", 300), ("h2", None, None)]


def test_bench_plan_sets_each_stages_predicted_compute_beside_its_cpu_time() -> None:
    from skippy.bench.plan import stage_compute_lines

    hosts = [(Host("a"), costs()), (Host("b"), costs())]
    f = facts()
    splits = best_splits(hosts, f, SHAPE, 16)
    split = splits[2]
    assert split is not None
    plan = Plan(f, SHAPE, 16, split, splits, (), stage_memory(f, 0, N_LAYER, SHAPE).total)
    predicted = plan.at(split, 16)
    per_token = [ms / predicted.rows for ms in predicted.stage_ms]
    level = {"concurrency": 16, "cpu_ms_per_token": {"stage:stage0": 2 * per_token[0], "adapter": 0.3}}
    _, line = stage_compute_lines(plan, [level])
    assert line.split("; ") == [f"  c=16  stage0 {per_token[0]:.2f} / {2 * per_token[0]:.2f} (2.00x)",
                                f"stage1 {per_token[1]:.2f} / -"]


def test_stages_on_one_cpu_set_add_up_and_share_the_micro_batches() -> None:
    table = costs()
    ranges = [(0, 4), (4, 8), (8, N_LAYER)]

    def round_for(cpus: list[str], addresses: list[str]) -> tuple[float, int]:
        stages = [StageCost(Host(f"h{i}", address=a, cpus=c), table, *r)
                  for i, (c, a, r) in enumerate(zip(cpus, addresses, ranges))]
        p = predict(stages, 16, facts().n_embd)
        return p.tpot_ms, p.in_flight

    own, own_batches = round_for(["0", "1", "2"], ["127.0.0.1"] * 3)
    shared, shared_batches = round_for(["0", "1", "0"], ["127.0.0.1"] * 3)
    apart, apart_batches = round_for(["0", "1", "0"], ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    assert (own_batches, shared_batches, apart_batches) == (3, 2, 3)  # as the driver counts them (stage_groups)
    assert shared > own and apart > own  # CPU 0 computes stage 0 and stage 2 both
    assert shared_cores([Host("a", cpus="0-1"), Host("b", cpus="1"), Host("c", cpus="2"), Host("d")]) == [[0, 1], [2], [3]]
