"""The whole decision: each host's costs, the best split for every stage count, and which one to serve.

`make_plan` calibrates (or loads) every host's cost table, runs the search (skippy.plan.search) at the
target concurrency (1 for `latency`), and picks the split with the most tok/s there (or, `--plan-for prefill|mixed`,
the lowest score of that objective: skippy.plan.objective). It says "don't
split" when one host holds the whole model and no split beats it, and names the hosts whose memory
cannot hold the whole model (the reason a split is necessary). When every host holds the whole model on
cores of its own, it also weighs replicas, one pipeline per host behind the broker (`replicate`, on by
default; `--no-replicas` turns it off), and serves them when they beat one host alone at the target
concurrency (at one stream they cannot) unless a split is predicted SPLIT_MARGIN faster: measured at 16
streams on two cores, splits ran at 0.90x their prediction or less and replicas at 1.01x (docs/plan.md),
and a replica that dies leaves the others serving. `Plan.report()` is what `skippy plan` prints: the
hosts, each stage's layers, predicted compute and memory, and TPOT and tok/s at every level for the plan,
the best split and the best single host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from skippy.config.errors import ConfigError
from skippy.plan.calibrate import calibrated_costs
from skippy.plan.costs import DEFAULT_OVERHEADS, ComputeCosts, Overheads
from skippy.plan.hosts import Host
from skippy.plan.memory import DEFAULT_SHAPE, MIB, ModelFacts, ServingShape, read_model_facts, stage_memory
from skippy.plan.objective import DECODE, Objective
from skippy.plan.predict import Prediction, StageCost, predict, predict_replicas, prefill_ms, shared_cores
from skippy.plan.search import Split, best_splits

__all__ = ["LEVELS", "SPLIT_MARGIN", "Plan", "host_costs", "make_plan", "plan_from_costs"]

LEVELS = (1, 4, 16)
SPLIT_MARGIN = 1.1  # a split is served over replicas only when predicted this much faster


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
    replicas: tuple[Split, ...] = ()  # the whole model on each host (weighed when every host holds it apart)
    replicated: bool = False  # serve `replicas` (one pipeline each) rather than `chosen`
    objective: Objective = DECODE  # what the split is chosen for (--plan-for)

    @property
    def single(self) -> Split | None:
        return self.splits.get(1)

    @property
    def served(self) -> tuple[Split, ...]:
        """The pipelines to serve: each replica, or the chosen split alone."""
        return self.replicas if self.replicated else (self.chosen,)

    @property
    def stage_prefixes(self) -> list[str]:
        """Each served pipeline's stage-id prefix (`replica<i>-`; none for a split), as skippy.plan.write names them."""
        return [f"replica{i}-" for i in range(len(self.replicas))] if self.replicated else [""]

    def stage_ids(self) -> list[str]:
        return [f"{prefix}stage{i}" for prefix, split in zip(self.stage_prefixes, self.served) for i in range(len(split.stages))]

    def at(self, split: Split, concurrency: int) -> Prediction:
        return predict(split.stages, concurrency, self.facts.n_embd, self.overheads, self.prefill_ratio)

    def replicas_at(self, concurrency: int) -> Prediction:
        return predict_replicas([r.stages for r in self.replicas], concurrency, self.facts.n_embd, self.overheads,
                                self.prefill_ratio)

    def prefill_s(self, split: Split) -> float:
        """`split`'s predicted prefill of the objective's prompt, in seconds."""
        return prefill_ms(split.stages, self.objective.prompt_tokens, self.facts.n_embd, self.overheads) / 1e3

    def predicted(self, concurrency: int) -> Prediction:
        """What is served, at `concurrency` streams."""
        return self.replicas_at(concurrency) if self.replicated else self.at(self.chosen, concurrency)

    def verdict(self) -> str:
        c, chosen, single = self.concurrency, self.chosen, self.single
        if self.replicated:
            names = ", ".join(r.stages[0].host.name for r in self.replicas)
            tok_s = self.replicas_at(c).tok_s
            split = f"the best split ({len(chosen.stages)} stage(s))" if len(chosen.stages) > 1 else "one host alone"
            return (f"replicate: the whole model on each of {len(self.replicas)} hosts ({names}), one pipeline each:"
                    f" {tok_s / chosen.prediction.tok_s:.2f}x the tok/s of {split} at {c} stream(s)"
                    f" (predicted {tok_s:.1f} tok/s)")
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
        shown = (f"{len(self.replicas)} replicas of 1 stage" if self.replicated
                 else f"{len(self.chosen.stages)} stage(s)")
        lines.append(f"plan, chosen for {self.objective.describe(self.concurrency)}: {shown}")
        for r, split in enumerate(self.served):
            for i, (stage, memory) in enumerate(zip(split.stages, split.memory)):
                ms = "; ".join(f"{n} rows {stage.costs.stage_ms(stage.start, stage.end, n):.1f} ms" for n in (1, 16))
                name = f"replica{r}" if self.replicated else f"stage{i}"
                lines.append(f"  {name} on {stage.host.name}: layers {stage.start}-{stage.end}; compute {ms};"
                             f" memory {memory.describe()}")
        rows: list[tuple[str, Callable[[int], Prediction]]] = [("this plan", self.predicted)]
        if self.replicated and len(self.chosen.stages) > 1:
            rows.append((f"best split ({len(self.chosen.stages)})", lambda c: self.at(self.chosen, c)))
        single = self.single
        if single is not None and (self.replicated or len(self.chosen.stages) > 1):
            rows.append((f"{single.stages[0].host.name} alone", lambda c: self.at(single, c)))
        lines.append("predicted".ljust(24) + "".join(f"c={c}: TPOT ms, tok/s".rjust(24) for c in levels))
        for name, at in rows:
            cells = [at(c) for c in levels]
            lines.append(f"  {name}".ljust(24) + "".join(f"{p.tpot_ms:.1f}, {p.tok_s:.1f}".rjust(24) for p in cells))
        if self.objective.prefills:
            named = [("this plan", self.served[0]), (f"best split ({len(self.chosen.stages)})", self.chosen),
                     (f"{single.stages[0].host.name} alone" if single else "", single)]
            lines.append(f"predicted prefill of a {self.objective.prompt_tokens}-token prompt: " + "; ".join(
                f"{name} {self.prefill_s(split):.1f} s" for i, (name, split) in enumerate(named)
                if split is not None and (i == 0 or split is not self.served[0])))
        lines.append(self.verdict())
        return "\n".join(lines)


def _replicas(costed: Sequence[tuple[Host, ComputeCosts]], facts: ModelFacts, shape: ServingShape, concurrency: int,
              overheads: Overheads, prefill_ratio: float) -> tuple[Split, ...]:
    """The whole model on each host, when there are several and no two share cores (else none); the caller has
    checked that each holds it."""
    hosts = [h for h, _ in costed]
    if len(hosts) < 2 or len(shared_cores(hosts)) < len(hosts):
        return ()
    memory = stage_memory(facts, 0, facts.n_layer, shape)
    copies = [(StageCost(h, costs, 0, facts.n_layer),) for h, costs in costed]
    return tuple(Split(c, (memory,), predict(c, concurrency, facts.n_embd, overheads, prefill_ratio)) for c in copies)


def make_plan(model: Path, hosts: Sequence[Host], shape: ServingShape = DEFAULT_SHAPE, concurrency: int = 16, *,
              stages: int | None = None, refresh: bool = False, overheads: Overheads = DEFAULT_OVERHEADS,
              prefill_ratio: float = 0.0, replicate: bool = True, objective: Objective = DECODE) -> Plan:
    """The split to serve `model` on `hosts` (`stages`: exactly that many), chosen for `concurrency` streams
    (or another `objective`);
    `replicate`: or the whole model on every host, one pipeline each, when that is faster (and `stages`, if
    given, is one per host)."""
    if not hosts:
        raise ConfigError("a plan needs at least one host")
    if concurrency < 1:
        raise ConfigError(f"the target concurrency must be >= 1, got {concurrency}")
    facts = read_model_facts(model)
    if stages is not None and not 1 <= stages <= min(len(hosts), facts.n_layer):
        raise ConfigError(f"cannot plan {stages} stages over {len(hosts)} host(s) and {facts.n_layer} layers")
    if prefill_ratio < 0:
        raise ConfigError(f"prompt tokens per generated token must be >= 0, got {prefill_ratio:g}")
    return plan_from_costs(host_costs(model, hosts, refresh), facts, shape, concurrency, stages=stages,
                           overheads=overheads, prefill_ratio=prefill_ratio, replicate=replicate, objective=objective)


def plan_from_costs(costed: Sequence[tuple[Host, ComputeCosts]], facts: ModelFacts, shape: ServingShape,
                    concurrency: int, *, stages: int | None = None, overheads: Overheads = DEFAULT_OVERHEADS,
                    prefill_ratio: float = 0.0, replicate: bool = True, objective: Objective = DECODE) -> Plan:
    """make_plan's choice once every host has its cost table."""
    hosts = [h for h, _ in costed]
    splits = best_splits(costed, facts, shape, concurrency, overheads, prefill_ratio, objective)
    whole = stage_memory(facts, 0, facts.n_layer, shape).total
    too_small = tuple(h for h in hosts if h.mem_bytes is not None and h.mem_bytes < whole)
    options = [s for k, s in splits.items() if s is not None and (stages is None or k == stages)]
    if not options:
        budgets = ", ".join(f"{h.name} {h.mem_mb:g} MiB" if h.mem_mb else f"{h.name} unlimited" for h in hosts)
        counts = f"{stages} stage(s)" if stages else "any split"
        raise ConfigError(f"{facts.path.name} does not fit {counts} of these hosts ({budgets}); the whole model needs"
                          f" {whole / MIB:.0f} MiB at {shape.lane_count} lanes x {shape.ctx_size} context")
    score = lambda s: objective.score(s.stages, concurrency, facts.n_embd, overheads, prefill_ratio)  # noqa: E731
    chosen = min(options, key=lambda s: (score(s), len(s.stages)))
    plan = Plan(facts, shape, concurrency, chosen, splits, too_small, whole, overheads, prefill_ratio,
                objective=objective)
    if not replicate or stages not in (None, len(hosts)) or too_small:
        return plan
    plan = replace(plan, replicas=_replicas(costed, facts, shape, concurrency, overheads, prefill_ratio))
    if not plan.replicas:
        return plan
    if objective.kind == "decode":
        tok_s = plan.replicas_at(concurrency).tok_s
        alone = max(r.prediction.tok_s for r in plan.replicas)
        return replace(plan, replicated=tok_s > alone and tok_s * SPLIT_MARGIN >= chosen.prediction.tok_s)
    ms = objective.replicas_score([r.stages for r in plan.replicas], concurrency, facts.n_embd, overheads, prefill_ratio)
    return replace(plan, replicated=ms < min(map(score, plan.replicas)) and ms <= score(chosen) * SPLIT_MARGIN)
