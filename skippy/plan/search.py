"""Choosing a split: a DP over layer boundaries and hosts, for each stage count, within every host's memory.

For k stages at concurrency c the micro-batch size is fixed (b = ceil(c / min(k, c)) decode rows and their
share of prompt rows, skippy.plan.predict),
so each (host, layer range) has one compute cost and one memory need. A round is the larger of the
trip (sum of stage costs and hops) and min(k, c) x the bottleneck (the slowest stage or link), so the
DP keeps, for every (layers placed, last host, stages used), the Pareto front of (bottleneck, trip)
pairs: no single number decides which partial split extends best. Hosts keep their given order (stage 0
on the first host used) and each hosts at most one stage; a host may be left out. A range is placed on
a host only if the stage's predicted memory (skippy.plan.memory) fits its budget. The best k-stage
split minimises the round, i.e. maximises tok/s at c (`c = 1`: single-stream latency).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from skippy.plan.costs import DEFAULT_OVERHEADS, ComputeCosts, Overheads
from skippy.plan.hosts import Host
from skippy.plan.memory import ModelFacts, ServingShape, StageMemory, stage_memory
from skippy.plan.predict import Prediction, StageCost, hop_ms, micro_batches, predict, stage_compute_ms, transfer_ms

__all__ = ["Split", "best_splits"]

Path_ = tuple[tuple[int, int, int], ...]  # (host index, layer start, layer end) per stage
Front = list[tuple[float, float, Path_]]  # (bottleneck ms, trip ms so far, stages)


@dataclass(frozen=True)
class Split:
    """One split: its stages, their predicted memory, and the prediction at the concurrency it was chosen for."""

    stages: tuple[StageCost, ...]
    memory: tuple[StageMemory, ...]
    prediction: Prediction

    @property
    def boundaries(self) -> list[int]:
        return [s.start for s in self.stages[1:]]


def _add(front: Front, entry: tuple[float, float, Path_]) -> None:
    """Add `entry` to a Pareto front of (bottleneck, trip), dropping what it dominates."""
    bottleneck, trip, _ = entry
    if any(b <= bottleneck and t <= trip for b, t, _ in front):
        return
    front[:] = [e for e in front if not (bottleneck <= e[0] and trip <= e[1])]
    front.append(entry)


def _best_for(k: int, hosts: Sequence[tuple[Host, ComputeCosts]], facts: ModelFacts, shape: ServingShape,
              concurrency: int, overheads: Overheads, prefill_ratio: float) -> Path_ | None:
    n, count = facts.n_layer, len(hosts)
    in_flight, rows = micro_batches(k, concurrency)
    budgets = [h.mem_bytes for h, _ in hosts]
    ranges = [(a, j) for a in range(n) for j in range(a + 1, n + 1) if k == 1 or (a, j) != (0, n)]
    need = {r: stage_memory(facts, *r, shape).total for r in ranges}
    cost: dict[tuple[int, int, int], float] = {}
    for h, (_, costs) in enumerate(hosts):
        budget = budgets[h]
        for a, j in ranges:
            if budget is None or need[a, j] <= budget:
                cost[h, a, j] = stage_compute_ms(StageCost(hosts[h][0], costs, a, j), rows, prefill_ratio, overheads)
    hop = [hop_ms(h, rows, facts.n_embd, overheads) for h, _ in hosts]
    wire = [transfer_ms(h, rows, facts.n_embd) for h, _ in hosts]
    fronts: dict[tuple[int, int, int], Front] = {}  # (layers placed, last host, stages) -> front
    for (h, a, j), ms in cost.items():
        if a == 0:
            _add(fronts.setdefault((j, h, 1), []), (ms, ms, ((h, 0, j),)))
    for s in range(1, k):
        for (placed, last, used), front in sorted(fronts.items()):
            if used != s or placed == n:
                continue
            for h in range(last + 1, count - (k - s - 1)):
                for j in range(placed + 1, n + 1):
                    if (h, placed, j) not in cost:
                        continue
                    ms = cost[h, placed, j]
                    target = fronts.setdefault((j, h, s + 1), [])
                    for bottleneck, trip, path in front:
                        _add(target, (max(bottleneck, ms, wire[last]), trip + hop[last] + ms, (*path, (h, placed, j))))
    best: tuple[float, Path_] | None = None
    for (placed, last, used), front in fronts.items():
        if placed != n or used != k:
            continue
        for bottleneck, trip, path in front:
            total = trip + overheads.step_ms if k == 1 else \
                max(trip + overheads.return_ms + hosts[last][0].delay_ms, in_flight * bottleneck)
            if best is None or total < best[0]:
                best = (total, path)
    return None if best is None else best[1]


def best_splits(hosts: Sequence[tuple[Host, ComputeCosts]], facts: ModelFacts, shape: ServingShape, concurrency: int,
                overheads: Overheads = DEFAULT_OVERHEADS, prefill_ratio: float = 0.0) -> dict[int, Split | None]:
    """For every stage count 1..len(hosts), the split with the shortest round at `concurrency` (None: none fits)."""
    found: dict[int, Split | None] = {}
    for k in range(1, min(len(hosts), facts.n_layer) + 1):
        path = _best_for(k, hosts, facts, shape, concurrency, overheads, prefill_ratio)
        if path is None:
            found[k] = None
            continue
        stages = tuple(StageCost(hosts[h][0], hosts[h][1], a, j) for h, a, j in path)
        found[k] = Split(stages, tuple(stage_memory(facts, s.start, s.end, shape) for s in stages),
                         predict(stages, concurrency, facts.n_embd, overheads, prefill_ratio))
    return found
