"""The whole decision: each host's costs, the best split for every stage count, and which one to serve.

`make_plan` calibrates (or loads) every host's cost table, runs the search (skippy.plan.search) at the
target concurrency (1 for `latency`), and picks the split with the most tok/s there. It says "don't
split" when one host holds the whole model and no split beats it, and names the hosts whose memory
cannot hold the whole model (the reason a split is necessary). `Plan.report()` is what `skippy plan`
prints: the hosts, each stage's layers, predicted compute and memory, and TPOT and tok/s at every
level for the plan and for the best single host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from skippy.config.errors import ConfigError
from skippy.plan.calibrate import calibrated_costs
from skippy.plan.costs import DEFAULT_OVERHEADS, ComputeCosts, Overheads
from skippy.plan.hosts import Host
from skippy.plan.memory import DEFAULT_SHAPE, MIB, ModelFacts, ServingShape, read_model_facts, stage_memory
from skippy.plan.predict import Prediction, predict
from skippy.plan.search import Split, best_splits

__all__ = ["LEVELS", "Plan", "host_costs", "make_plan"]

LEVELS = (1, 4, 16)


def host_costs(model: Path, hosts: Sequence[Host], refresh: bool = False) -> list[tuple[Host, ComputeCosts]]:
    """Each host with its cost table: its own file, else calibrated here on its CPU set; times its speed."""
    tables: dict[str, ComputeCosts] = {}
    out = []
    for host in hosts:
        if host.calibration is not None:
            costs = ComputeCosts.load(Path(host.calibration))
        else:
            cpus = host.cpus or "all"
            if cpus not in tables:
                tables[cpus] = calibrated_costs(model, cpus, refresh=refresh)
            costs = tables[cpus]
        if costs.n_layer != read_model_facts(model).n_layer:
            raise ConfigError(f"host {host.name}: its cost table has {costs.n_layer} layers, {model.name} has"
                              f" {read_model_facts(model).n_layer}")
        out.append((host, costs.scaled(host.speed) if host.speed != 1 else costs))
    return out


@dataclass(frozen=True)
class Plan:
    facts: ModelFacts
    shape: ServingShape
    concurrency: int  # what the split was chosen for
    chosen: Split
    splits: dict[int, Split | None]  # the best split of each stage count
    too_small: tuple[Host, ...]  # hosts whose memory cannot hold the whole model
    whole_need: int  # bytes one stage holding every layer needs
    overheads: Overheads = field(default_factory=Overheads)
    prefill_ratio: float = 0.0  # prompt tokens per generated token of the workload

    @property
    def single(self) -> Split | None:
        return self.splits.get(1)

    def at(self, split: Split, concurrency: int) -> Prediction:
        return predict(split.stages, concurrency, self.facts.n_embd, self.overheads, self.prefill_ratio)

    def verdict(self) -> str:
        c, chosen, single = self.concurrency, self.chosen, self.single
        if len(chosen.stages) == 1:
            return (f"don't split: {chosen.stages[0].host.name} holds the whole model and no split is faster at"
                    f" {c} stream(s) (predicted {chosen.prediction.tok_s:.1f} tok/s)")
        needs = f"the whole model needs {self.whole_need / MIB:.0f} MiB"
        if single is None:
            names = ", ".join(f"{h.name} ({h.mem_mb:g} MiB)" for h in self.too_small)
            return f"split into {len(chosen.stages)}: a split is necessary, no host's memory holds the model ({needs}): {names}"
        gain = chosen.prediction.tok_s / single.prediction.tok_s
        small = (f"; {', '.join(h.name for h in self.too_small)} could not hold it alone ({needs})"
                 if self.too_small else "")
        return (f"split into {len(chosen.stages)}: {gain:.2f}x the tok/s of {single.stages[0].host.name} alone at {c}"
                f" stream(s){small}")

    def report(self, levels: Sequence[int] = LEVELS) -> str:
        f, shape = self.facts, self.shape
        lines = [f"model {f.path.name}: {f.n_layer} layers, {f.file_bytes / MIB:.0f} MiB; serving {shape.lane_count} lanes"
                 f" x {shape.ctx_size} context, prefix cache {'on' if shape.prefix_cache else 'off'}"]
        hosts = list(dict.fromkeys(s.host for split in self.splits.values() if split for s in split.stages))
        lines += ["hosts:", *(f"  {h.describe()}" for h in hosts)]
        lines.append(f"plan, chosen for the most tok/s at {self.concurrency} stream(s): {len(self.chosen.stages)} stage(s)")
        for i, (stage, memory) in enumerate(zip(self.chosen.stages, self.chosen.memory)):
            ms = "; ".join(f"{r} rows {stage.costs.stage_ms(stage.start, stage.end, r):.1f} ms" for r in (1, 16))
            lines.append(f"  stage{i} on {stage.host.name}: layers {stage.start}-{stage.end}; compute {ms};"
                         f" memory {memory.describe()}")
        rows = [("this plan", self.chosen)] + ([(f"{self.single.stages[0].host.name} alone", self.single)]
                                               if self.single is not None and len(self.chosen.stages) > 1 else [])
        lines.append("predicted".ljust(24) + "".join(f"c={c}: TPOT ms, tok/s".rjust(24) for c in levels))
        for name, split in rows:
            cells = [self.at(split, c) for c in levels]
            lines.append(f"  {name}".ljust(24) + "".join(f"{p.tpot_ms:.1f}, {p.tok_s:.1f}".rjust(24) for p in cells))
        lines.append(self.verdict())
        return "\n".join(lines)


def make_plan(model: Path, hosts: Sequence[Host], shape: ServingShape = DEFAULT_SHAPE, concurrency: int = 16, *,
              stages: int | None = None, refresh: bool = False, overheads: Overheads = DEFAULT_OVERHEADS,
              prefill_ratio: float = 0.0) -> Plan:
    """The split to serve `model` on `hosts` (`stages`: exactly that many), chosen for `concurrency` streams."""
    if not hosts:
        raise ConfigError("a plan needs at least one host")
    if concurrency < 1:
        raise ConfigError(f"the target concurrency must be >= 1, got {concurrency}")
    facts = read_model_facts(model)
    if stages is not None and not 1 <= stages <= min(len(hosts), facts.n_layer):
        raise ConfigError(f"cannot plan {stages} stages over {len(hosts)} host(s) and {facts.n_layer} layers")
    if prefill_ratio < 0:
        raise ConfigError(f"prompt tokens per generated token must be >= 0, got {prefill_ratio:g}")
    splits = best_splits(host_costs(model, hosts, refresh), facts, shape, concurrency, overheads, prefill_ratio)
    whole = stage_memory(facts, 0, facts.n_layer, shape).total
    too_small = tuple(h for h in hosts if h.mem_bytes is not None and h.mem_bytes < whole)
    options = [s for k, s in splits.items() if s is not None and (stages is None or k == stages)]
    if not options:
        budgets = ", ".join(f"{h.name} {h.mem_mb:g} MiB" if h.mem_mb else f"{h.name} unlimited" for h in hosts)
        counts = f"{stages} stage(s)" if stages else "any split"
        raise ConfigError(f"{model.name} does not fit {counts} of these hosts ({budgets}); the whole model needs"
                          f" {whole / MIB:.0f} MiB at {shape.lane_count} lanes x {shape.ctx_size} context")
    chosen = min(options, key=lambda s: (s.prediction.tpot_ms, len(s.stages)))
    return Plan(facts, shape, concurrency, chosen, splits, too_small, whole, overheads, prefill_ratio)
