"""Choosing a split: a DP over layer boundaries and hosts, for each stage count, within every host's memory.

For k stages at concurrency c with m micro-batches in flight the micro-batch size is fixed (b = ceil(c / m)
decode rows and their share of prompt rows, skippy.plan.predict), so each (host, layer range) has one compute
cost and one memory need. A round is the larger of the trip (sum of stage costs and hops) and m x the busiest
resource: a link, or a group of hosts standing for overlapping CPU sets of this machine (`--stage-cpus 0,1,0`:
stages 0 and 2 share CPU 0, their work adds up). So the DP keeps, for every (layers placed, last host, stages
used), the Pareto front of (the closed groups' and links' bottleneck, the work of each group a later host still
belongs to, trip): no single number decides which partial split extends best. m is the number of core groups at
one address among the chosen hosts (as the driver counts its micro-batches), so where hosts share cores the
search runs once per possible m and scores every surviving split with `predict`. Hosts keep their given order
(stage 0 on the first host used) and each hosts at most one stage; a host may be left out. A range is placed on
a host only if the stage's predicted memory (skippy.plan.memory) fits its budget. The best k-stage split
minimises the round, i.e. maximises tok/s at c (`c = 1`: single-stream latency), or another objective's score
(skippy.plan.objective: a long prompt's prefill, alone or with an agent's short answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from skippy.plan.costs import DEFAULT_OVERHEADS, ComputeCosts, Overheads
from skippy.plan.hosts import Host
from skippy.plan.memory import ModelFacts, ServingShape, StageMemory, stage_memory
from skippy.plan.objective import DECODE, Objective
from skippy.plan.predict import (
    PREFILL_CHUNK_ROWS,
    Prediction,
    StageCost,
    hop_ms,
    micro_batches,
    predict,
    shared_cores,
    stage_compute_ms,
    transfer_ms,
)

__all__ = ["Split", "best_splits"]

Path_ = tuple[tuple[int, int, int], ...]  # (host index, layer start, layer end) per stage
Entry = tuple[float, tuple[float, ...], float, Path_]  # (closed bottleneck ms, open core groups' ms, trip ms, stages)
Front = list[Entry]


@dataclass(frozen=True)
class Split:
    """One split: its stages, their predicted memory, and the prediction at the concurrency it was chosen for."""

    stages: tuple[StageCost, ...]
    memory: tuple[StageMemory, ...]
    prediction: Prediction

    @property
    def boundaries(self) -> list[int]:
        return [s.start for s in self.stages[1:]]


def _add(front: Front, entry: Entry) -> None:
    """Add `entry` to a Pareto front of (closed bottleneck, each open group's work, trip), dropping what it dominates."""
    def covers(a: Entry, b: Entry) -> bool:  # a is no worse than b in every term
        return a[0] <= b[0] and a[2] <= b[2] and all(x <= y for x, y in zip(a[1], b[1]))

    if any(covers(e, entry) for e in front):
        return
    front[:] = [e for e in front if not covers(entry, e)]
    front.append(entry)


def _extend(entry: Entry, host: int, ms: float, hop: float, wire: float, group: Sequence[int],
            last_in_group: Sequence[int], path: Path_) -> Entry:
    """`entry` with one more stage on `host`: its work joins its core group's; a group no later host belongs to
    is closed (its work only bounds the round), as is the link the activations just crossed (`wire`)."""
    closed, loads, trip, _ = entry
    grown = list(loads)
    grown[group[host]] += ms
    for g, final in enumerate(last_in_group):
        if final <= host and grown[g]:
            closed, grown[g] = max(closed, grown[g]), 0.0
    return max(closed, wire), tuple(grown), trip + hop + ms, path


def _candidates(k: int, in_flight: int, hosts: Sequence[tuple[Host, ComputeCosts]], facts: ModelFacts,
                shape: ServingShape, concurrency: int, overheads: Overheads, prefill_ratio: float,
                chunk: int = 0) -> list[Path_]:
    """The k-stage splits no other beats in every term, with stage costs at `in_flight` micro-batches (`chunk`:
    of a prompt chunk of that many rows instead)."""
    n, count = facts.n_layer, len(hosts)
    rows = chunk or micro_batches(in_flight, concurrency)[1]
    groups = shared_cores([h for h, _ in hosts])
    group = [next(g for g, members in enumerate(groups) if h in members) for h in range(count)]
    last_in_group = [max(members) for members in groups]
    budgets = [h.mem_bytes for h, _ in hosts]
    ranges = [(a, j) for a in range(n) for j in range(a + 1, n + 1) if k == 1 or (a, j) != (0, n)]
    need = {r: stage_memory(facts, *r, shape).total for r in ranges}
    cost: dict[tuple[int, int, int], float] = {}
    for h, (_, costs) in enumerate(hosts):
        budget = budgets[h]
        for a, j in ranges:
            if budget is not None and need[a, j] > budget:
                continue
            cost[h, a, j] = (costs.chunk_ms(a, j, chunk) + overheads.stage_ms if chunk else
                             stage_compute_ms(StageCost(hosts[h][0], costs, a, j), rows, prefill_ratio, overheads))
    hop = [hop_ms(h, rows, facts.n_embd, overheads) for h, _ in hosts]
    wire = [transfer_ms(h, rows, facts.n_embd) for h, _ in hosts]
    empty: Entry = (0.0, (0.0,) * len(groups), 0.0, ())
    fronts: dict[tuple[int, int, int], Front] = {}  # (layers placed, last host, stages) -> front
    for (h, a, j), ms in cost.items():
        if a == 0:
            _add(fronts.setdefault((j, h, 1), []), _extend(empty, h, ms, 0.0, 0.0, group, last_in_group, ((h, 0, j),)))
    for s in range(1, k):
        for (placed, last, used), front in sorted(fronts.items()):
            if used != s or placed == n:
                continue
            for h in range(last + 1, count - (k - s - 1)):
                for j in range(placed + 1, n + 1):
                    if (h, placed, j) not in cost:
                        continue
                    target = fronts.setdefault((j, h, s + 1), [])
                    for entry in front:
                        _add(target, _extend(entry, h, cost[h, placed, j], hop[last], wire[last], group, last_in_group,
                                             (*entry[3], (h, placed, j))))
    return [e[3] for (placed, _, used), front in fronts.items() if placed == n and used == k for e in front]


def _best_for(k: int, hosts: Sequence[tuple[Host, ComputeCosts]], facts: ModelFacts, shape: ServingShape,
              concurrency: int, overheads: Overheads, prefill_ratio: float,
              objective: Objective) -> tuple[StageCost, ...] | None:
    """The k-stage split with the lowest `objective` score (the decode objective: the shortest predicted round).
    How many micro-batches are in flight depends on which hosts share cores, so the search runs once for each
    count and every surviving split is scored. An objective that counts a prompt's prefill also weighs the splits
    no other beats with the stages' costs of a prompt chunk (ComputeCosts.chunk_ms)."""
    best: tuple[float, tuple[StageCost, ...]] | None = None
    apart = all(len(g) == 1 for g in shared_cores([h for h, _ in hosts], same_address=True))
    for in_flight in sorted({micro_batches(m, concurrency)[0] for m in ([k] if apart else range(1, k + 1))}):
        paths = _candidates(k, in_flight, hosts, facts, shape, concurrency, overheads, prefill_ratio)
        if objective.prefills:
            paths += _candidates(k, in_flight, hosts, facts, shape, concurrency, overheads, prefill_ratio,
                                 PREFILL_CHUNK_ROWS)
        for path in paths:
            stages = tuple(StageCost(hosts[h][0], hosts[h][1], a, j) for h, a, j in path)
            score = objective.score(stages, concurrency, facts.n_embd, overheads, prefill_ratio)
            if best is None or score < best[0]:
                best = (score, stages)
    return None if best is None else best[1]


def best_splits(hosts: Sequence[tuple[Host, ComputeCosts]], facts: ModelFacts, shape: ServingShape, concurrency: int,
                overheads: Overheads = DEFAULT_OVERHEADS, prefill_ratio: float = 0.0,
                objective: Objective = DECODE) -> dict[int, Split | None]:
    """For every stage count 1..len(hosts), the split with the lowest `objective` score at `concurrency` (by default
    the shortest round; None: none fits)."""
    found: dict[int, Split | None] = {}
    for k in range(1, min(len(hosts), facts.n_layer) + 1):
        stages = _best_for(k, hosts, facts, shape, concurrency, overheads, prefill_ratio, objective)
        if stages is None:
            found[k] = None
            continue
        found[k] = Split(stages, tuple(stage_memory(facts, s.start, s.end, shape) for s in stages),
                         predict(stages, concurrency, facts.n_embd, overheads, prefill_ratio))
    return found
