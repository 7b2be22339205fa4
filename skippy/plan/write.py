"""Writing a plan: the topology and stage configs `skippy up --topology` serves, and plan.json beside them.

Stages on loopback hosts get ipc:// endpoints in the directory (as `skippy up`'s own split does);
stages on other addresses (namespace hosts, other machines) bind `tcp://<address>:<port + 10 i>`
(skippy.netns.topology.place_on_hosts). `plan.json` keeps the prediction (each stage's host, layers,
memory and compute; TPOT and tok/s per level) and `stage_cpus`, the `--stage-cpus` value pinning each
stage to its host's CPU set, when every chosen host names one.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from skippy.launcher import write_local_topology
from skippy.netns.topology import place_on_hosts
from skippy.plan.plan import LEVELS, Plan

__all__ = ["WrittenPlan", "write_plan"]


@dataclass(frozen=True)
class WrittenPlan:
    topology: Path
    configs: list[Path]
    stage_cpus: str | None  # the --stage-cpus value, or None when a chosen host has no CPU set
    summary: Path


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def write_plan(plan: Plan, directory: Path, *, model_id: str, extra: dict[str, object] | None = None,
               port: int = 19400) -> WrittenPlan:
    stages = plan.chosen.stages
    shape = plan.shape
    topology, configs = write_local_topology(directory, plan.facts.path, plan.facts.n_layer, plan.chosen.boundaries,
                                             lane_count=shape.lane_count, ctx_size=shape.ctx_size, model_id=model_id,
                                             topology_id="plan", extra=extra)
    addresses = [s.host.address for s in stages]
    if not all(_loopback(a) for a in addresses):
        place_on_hosts(topology, configs, addresses, port)
    cpus = [s.host.cpus for s in stages]
    stage_cpus = ",".join(c.replace(",", "+") for c in cpus if c) if all(cpus) else None
    summary = directory / "plan.json"
    summary.write_text(json.dumps({
        "model": str(plan.facts.path), "concurrency": plan.concurrency, "verdict": plan.verdict(),
        "stage_cpus": stage_cpus,
        "stages": [{"host": s.host.name, "address": s.host.address, "layer_start": s.start, "layer_end": s.end,
                    "memory_mib": round(m.total / (1 << 20), 1), "weights_mib": round(m.weights / (1 << 20), 1),
                    "kv_mib": round(m.kv / (1 << 20), 1), "compute_mib": round(m.compute / (1 << 20), 1)}
                   for s, m in zip(stages, plan.chosen.memory)],
        "predicted": [{"concurrency": c, "tpot_ms": round(p.tpot_ms, 2), "tok_s": round(p.tok_s, 2),
                       "stage_ms": [round(x, 2) for x in p.stage_ms]}
                      for c in sorted({*LEVELS, plan.concurrency}) for p in [plan.at(plan.chosen, c)]],
    }, indent=2))
    return WrittenPlan(topology, configs, stage_cpus, summary)
