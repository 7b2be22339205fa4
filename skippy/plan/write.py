"""Writing a plan: the topology and stage configs `skippy up --topology` serves, and plan.json beside them.

Stages on loopback hosts get ipc:// endpoints in the directory (as `skippy up`'s own split does);
stages on other addresses (namespace hosts, other machines) bind `tcp://<address>:<port + 10 i>`
(skippy.netns.topology.place_on_hosts). A replicated plan writes one pipeline per replica, each in
`r<i>/` (short: ipc paths are bounded) with stage ids `replica<i>-stage0` (distinct under one `skippy up`; on other addresses each
replica's port is `port + 100 i`). `plan.json` keeps the prediction (each stage's id, host, layers, memory and
compute; TPOT and tok/s per level) and, per pipeline, `stage_cpus`, the `--stage-cpus` value pinning its
stages to their hosts' CPU sets, when every chosen host names one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from skippy.launcher import PipelineFiles, write_local_topology
from skippy.netns.topology import place_on_hosts
from skippy.plan.hosts import loopback_address
from skippy.plan.plan import LEVELS, Plan
from skippy.plan.search import Split

__all__ = ["PipelineFiles", "WrittenPlan", "write_plan"]


@dataclass(frozen=True)
class WrittenPlan:
    pipelines: tuple[PipelineFiles, ...]  # the chosen split, or each replica
    summary: Path

    @property
    def topology(self) -> Path:
        return self.pipelines[0].topology

    @property
    def configs(self) -> list[Path]:
        return self.pipelines[0].configs

    @property
    def stage_cpus(self) -> str | None:
        return self.pipelines[0].stage_cpus


def _write_pipeline(plan: Plan, split: Split, directory: Path, topology_id: str, stage_prefix: str, model_id: str,
                    extra: dict[str, object] | None, port: int) -> PipelineFiles:
    shape = plan.shape
    topology, configs = write_local_topology(directory, plan.facts.path, plan.facts.n_layer, split.boundaries,
                                             lane_count=shape.lane_count, ctx_size=shape.ctx_size, model_id=model_id,
                                             topology_id=topology_id, extra=extra, stage_prefix=stage_prefix)
    addresses = [s.host.address for s in split.stages]
    if not all(loopback_address(a) for a in addresses):
        place_on_hosts(topology, configs, addresses, port)
    cpus = [s.host.cpus for s in split.stages]
    return PipelineFiles(topology, configs, ",".join(c.replace(",", "+") for c in cpus if c) if all(cpus) else None)


def write_plan(plan: Plan, directory: Path, *, model_id: str, extra: dict[str, object] | None = None,
               port: int = 19400) -> WrittenPlan:
    if plan.replicated:
        pipelines = tuple(_write_pipeline(plan, split, directory / f"r{i}", f"plan-replica{i}", prefix, model_id,
                                          extra, port + 100 * i)
                          for i, (split, prefix) in enumerate(zip(plan.replicas, plan.stage_prefixes)))
    else:
        pipelines = (_write_pipeline(plan, plan.chosen, directory, "plan", "", model_id, extra, port),)
    summary = directory / "plan.json"
    summary.write_text(json.dumps({
        "model": str(plan.facts.path), "concurrency": plan.concurrency, "verdict": plan.verdict(),
        "stage_cpus": pipelines[0].stage_cpus if len(pipelines) == 1 else None,
        "replicas": [{"topology": str(p.topology), "stage_cpus": p.stage_cpus} for p in pipelines] if plan.replicated else [],
        "stages": [{"stage_id": f"{prefix}stage{i}", "host": s.host.name, "address": s.host.address,
                    "layer_start": s.start, "layer_end": s.end,
                    "memory_mib": round(m.total / (1 << 20), 1), "weights_mib": round(m.weights / (1 << 20), 1),
                    "kv_mib": round(m.kv / (1 << 20), 1), "compute_mib": round(m.compute / (1 << 20), 1)}
                   for split, prefix in zip(plan.served, plan.stage_prefixes)
                   for i, (s, m) in enumerate(zip(split.stages, split.memory))],
        "predicted": [{"concurrency": c, "tpot_ms": round(p.tpot_ms, 2), "tok_s": round(p.tok_s, 2),
                       "stage_ms": [round(x, 2) for x in p.stage_ms]}
                      for c in sorted({*LEVELS, plan.concurrency}) for p in [plan.predicted(c)]],
    }, indent=2))
    return WrittenPlan(pipelines, summary)
