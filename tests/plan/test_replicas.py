"""Replicas in the planner, on synthetic cost tables: the whole model on each host, one pipeline per host.

They are weighed only when there are several hosts, each holds the whole model and no two share cores; they are
served when predicted faster than one host alone (never at one stream: one stream uses one replica) unless a split
is predicted SPLIT_MARGIN faster still, and the prediction spreads the streams evenly over them. A replicated plan
is written as one topology per replica whose stage ids are distinct, so one `skippy up` can serve them all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_helpers import N_LAYER, SHAPE, costs, facts

from skippy.config import StageTopology
from skippy.config.stage import StageConfig
from skippy.plan.hosts import Host
from skippy.plan.memory import MIB, stage_memory
from skippy.plan.plan import SPLIT_MARGIN, plan_from_costs
from skippy.plan.predict import StageCost, predict, predict_replicas
from skippy.plan.write import write_plan


def two_cores(mem_mb: float | None = None, speed_b: float = 1.0) -> list[tuple[Host, object]]:
    return [(Host("a", cpus="0", mem_mb=mem_mb), costs(1.0)), (Host("b", cpus="1", mem_mb=mem_mb), costs(speed_b))]


def test_streams_spread_evenly_over_replicas_and_their_tok_s_add_up() -> None:
    f = facts()
    copies = [[StageCost(h, c, 0, N_LAYER)] for h, c in two_cores(speed_b=2.0)]  # type: ignore[arg-type]
    both = predict_replicas(copies, 5, f.n_embd)
    alone = [predict(copies[0], 3, f.n_embd), predict(copies[1], 2, f.n_embd)]  # 5 streams: 3 + 2
    assert both.tok_s == pytest.approx(alone[0].tok_s + alone[1].tok_s)
    assert both.tpot_ms == pytest.approx(max(p.tpot_ms for p in alone)) and both.in_flight == 2
    one = predict_replicas(copies, 1, f.n_embd)  # one stream: one replica busy
    assert one.tok_s == pytest.approx(predict(copies[0], 1, f.n_embd).tok_s) and one.in_flight == 1


def test_replicas_are_served_when_faster_than_any_split() -> None:
    plan = plan_from_costs(two_cores(), facts(), SHAPE, 16)  # type: ignore[arg-type]
    assert plan.replicated and len(plan.served) == 2
    assert all((s.stages[0].start, s.stages[0].end) for s in plan.served)
    assert [(s.stages[0].start, s.stages[0].end) for s in plan.served] == [(0, N_LAYER)] * 2
    assert plan.predicted(16).tok_s * SPLIT_MARGIN >= plan.chosen.prediction.tok_s
    assert plan.verdict().startswith("replicate: the whole model on each of 2 hosts (a, b)")
    assert "replica1 on b: layers 0-12" in plan.report() and "best split (2)" in plan.report()
    assert plan.stage_ids() == ["replica0-stage0", "replica1-stage0"]


@pytest.mark.parametrize("why", ["one stream", "asked not to", "a split of fewer stages asked", "shared core",
                                 "too little memory"])
def test_replicas_are_not_served(why: str) -> None:
    f = facts()
    hosts = two_cores()
    concurrency, stages, replicate = 16, None, True
    if why == "one stream":
        concurrency = 1  # one replica serves it: no gain, so no second copy of the model
    elif why == "asked not to":
        replicate = False
    elif why == "a split of fewer stages asked":
        stages = 1
    elif why == "shared core":
        hosts = [(Host("a", cpus="0"), costs()), (Host("b", cpus="0"), costs())]
    else:
        whole = stage_memory(f, 0, N_LAYER, SHAPE).total / MIB
        hosts = two_cores(mem_mb=whole * 0.75)  # each holds half the model, not all of it
    plan = plan_from_costs(hosts, f, SHAPE, concurrency, stages=stages, replicate=replicate)  # type: ignore[arg-type]
    assert not plan.replicated and plan.served == (plan.chosen,)
    assert not plan.verdict().startswith("replicate")
    if why in ("shared core", "too little memory"):
        assert plan.replicas == ()


def test_a_replicated_plan_is_written_as_one_topology_per_replica(tmp_path: Path) -> None:
    f = facts()
    f = type(f)(**{**f.__dict__, "path": tmp_path / "model.gguf"})
    plan = plan_from_costs(two_cores(), f, SHAPE, 16)  # type: ignore[arg-type]
    written = write_plan(plan, tmp_path / "plan", model_id="m")
    assert [p.stage_cpus for p in written.pipelines] == ["0", "1"]
    ids = []
    for i, pipeline in enumerate(written.pipelines):
        topology = StageTopology.load(pipeline.topology)
        assert topology.topology_id == f"plan-replica{i}" and len(topology.stages) == 1
        assert [c.name for c in pipeline.configs] == [f"{topology.stages[0].stage_id}.json"]
        config = StageConfig.load(pipeline.configs[0])
        assert (config.layer_start, config.layer_end, config.downstream) == (0, N_LAYER, None)
        ids.append(topology.stages[0].stage_id)
    assert ids == plan.stage_ids()
    summary = json.loads(written.summary.read_text())
    assert [r["stage_cpus"] for r in summary["replicas"]] == ["0", "1"] and len(summary["stages"]) == 2
    assert summary["predicted"][-1]["tok_s"] == round(plan.predicted(16).tok_s, 2)
