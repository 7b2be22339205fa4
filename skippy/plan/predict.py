"""The pipeline model: TPOT and tok/s of a split at a concurrency, from the stages' costs and the links.

With S stages on S hosts, stage 0 keeps m = min(S, c) micro-batches in flight (one per host, as the
driver does), each of b = ceil(c / m) decode rows. A round gives every session one token; it lasts
the longer of one micro-batch's trip (every stage's compute, every forward hop: software, the sender's
link delay, the activations over its rate; the return hop with stage 0's postprocess) and the busiest
resource's work (m batches on the slowest stage, or on the slowest link; stages whose hosts stand for
overlapping CPU sets of this machine, as 3 stages on `--stage-cpus 0,1,0`, are one resource: their work adds
up). One stage alone is its compute plus the step loop's overhead. TPOT = the round, tok/s = c / round. A workload whose requests
prefill P prompt tokens per G generated (`prefill_ratio` = P / G) adds P / G prefill rows to every decode
row of a micro-batch, as the driver packs prompt chunks into the same batches (through the layers; only
decode rows go through the head). Replicas (the whole model on each of several hosts, one pipeline each, the
broker routing each stream to the least loaded): the c streams spread evenly over them; tok/s is the sum of each
replica's, TPOT the slowest replica's. `prefill_ms`: one long prompt's time to its first token, its chunks
pipelined: the first chunk's trip, then one chunk per busiest resource's chunk time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from skippy.config.cpu_sets import parse_cpu_list
from skippy.plan.costs import DEFAULT_OVERHEADS, ComputeCosts, Overheads, interpolate
from skippy.plan.hosts import Host

__all__ = ["PREFILL_CHUNK_ROWS", "Prediction", "StageCost", "hop_ms", "micro_batches", "predict", "predict_replicas",
           "prefill_ms", "replica_shares", "shared_cores", "stage_compute_ms", "transfer_ms"]

WIRE_BYTES = 4  # f32 activations on the wire (--activation-wire-dtype f16 / q8 shrink them)
PREFILL_CHUNK_ROWS = 128  # a prompt's chunk when its chunks pipeline (the driver's adaptive ramp starts there)


@dataclass(frozen=True)
class StageCost:
    """One stage as the model sees it: the host it runs on (its link sends), its costs and layers."""

    host: Host
    costs: ComputeCosts
    start: int
    end: int


@dataclass(frozen=True)
class Prediction:
    concurrency: int
    tpot_ms: float
    tok_s: float
    stage_ms: tuple[float, ...]  # each stage's compute of one micro-batch
    rows: int  # decode rows per micro-batch
    in_flight: int  # micro-batches in flight


def transfer_ms(host: Host, rows: float, n_embd: int) -> float:
    """Activations of `rows` rows over `host`'s rate."""
    return rows * n_embd * WIRE_BYTES * 8 / (host.mbps * 1e3) if host.mbps else 0.0


def hop_ms(host: Host, rows: float, n_embd: int, overheads: Overheads) -> float:
    """A forward hop from `host`: software, its link's delay and the transfer."""
    return overheads.hop_ms + host.delay_ms + transfer_ms(host, rows, n_embd)


def shared_cores(hosts: Sequence[Host], *, same_address: bool = False) -> list[list[int]]:
    """The stages (indexes) computing on the same cores: hosts whose CPU sets of this machine overlap share them;
    a host without a CPU set is a machine of its own. `same_address`: only hosts at one address are grouped, as
    the driver counts its micro-batches (one per group, skippy.config.cpu_sets.stage_groups)."""
    groups: list[tuple[set[int], list[int]]] = []
    for index, host in enumerate(hosts):
        cpus = set(parse_cpu_list(host.cpus)) if host.cpus else None
        merged = [g for g in groups if cpus is not None and g[0] & cpus
                  and not (same_address and any(hosts[i].address != host.address for i in g[1]))]
        for group in merged:
            groups.remove(group)
        groups.append((set().union(cpus or set(), *(g[0] for g in merged)),
                       sorted([index, *(i for g in merged for i in g[1])])))
    return [members for _, members in groups]


def round_ms(stage_ms: Sequence[float], hops: Sequence[float], transfers: Sequence[float], back_ms: float,
             in_flight: int, cores: Sequence[Sequence[int]] | None = None) -> float:
    """A round: the longer of one micro-batch's trip and the busiest cores' or link's work (`cores`: the stages
    sharing cores, shared_cores; default each stage its own)."""
    trip = sum(stage_ms) + sum(hops) + back_ms
    busiest = max(sum(stage_ms[i] for i in group) for group in cores) if cores else max(stage_ms)
    return max(trip, in_flight * busiest, in_flight * max(transfers, default=0.0))


def micro_batches(n_stages: int, concurrency: int) -> tuple[int, int]:
    """(micro-batches in flight, decode rows in each), for `n_stages` groups of stages not sharing cores."""
    in_flight = min(n_stages, concurrency)
    return in_flight, math.ceil(concurrency / in_flight)


def stage_compute_ms(stage: StageCost, rows: int, prefill_ratio: float, overheads: Overheads) -> float:
    """A stage's compute of one micro-batch: `rows` decode rows and their share of prompt rows."""
    return stage.costs.stage_ms(stage.start, stage.end, rows * (1.0 + prefill_ratio), rows) + overheads.stage_ms


def predict(stages: Sequence[StageCost], concurrency: int, n_embd: int, overheads: Overheads = DEFAULT_OVERHEADS,
            prefill_ratio: float = 0.0) -> Prediction:
    in_flight, rows = micro_batches(len(shared_cores([s.host for s in stages], same_address=True)), concurrency)
    ms = tuple(stage_compute_ms(s, rows, prefill_ratio, overheads) for s in stages)
    if len(stages) == 1:
        total = ms[0] + overheads.step_ms
    else:
        hops = [hop_ms(s.host, rows, n_embd, overheads) for s in stages[:-1]]
        transfers = [transfer_ms(s.host, rows, n_embd) for s in stages[:-1]]
        total = round_ms(ms, hops, transfers, overheads.return_ms + stages[-1].host.delay_ms, in_flight,
                         shared_cores([s.host for s in stages]))
    return Prediction(concurrency, total, concurrency * 1e3 / total, ms, rows, in_flight)


def prefill_ms(stages: Sequence[StageCost], prompt_tokens: int, n_embd: int, overheads: Overheads = DEFAULT_OVERHEADS,
               chunk: int = PREFILL_CHUNK_ROWS) -> float:
    """One prompt's prefill, to its first token, on an otherwise idle split: its chunks of `chunk` rows follow each
    other down the stages without waiting (as the driver sends them), so after the first chunk's trip through
    every stage one more finishes each time the busiest resource (a group of stages sharing cores, or a link) is
    done with one. Chunks run through the layers only; the prompt's last row also goes through the head."""
    chunks = math.ceil(prompt_tokens / chunk)
    ms = [s.costs.chunk_ms(s.start, s.end, chunk) + overheads.stage_ms for s in stages]
    head = interpolate(stages[-1].costs.rows, stages[-1].costs.head_ms, 1)  # the prompt's last row
    if len(stages) == 1:
        return chunks * (ms[0] + overheads.step_ms) + head
    hops = [hop_ms(s.host, chunk, n_embd, overheads) for s in stages[:-1]]
    transfers = [transfer_ms(s.host, chunk, n_embd) for s in stages[:-1]]
    trip = sum(ms) + sum(hops) + overheads.return_ms + stages[-1].host.delay_ms
    cores = shared_cores([s.host for s in stages])
    busiest = max(max(sum(ms[i] for i in group) for group in cores), max(transfers, default=0.0))
    return trip + (chunks - 1) * busiest + head


def replica_shares(concurrency: int, replicas: int) -> list[int]:
    """The streams each of `replicas` serves: c // n, one more for the first c % n."""
    return [concurrency // replicas + (i < concurrency % replicas) for i in range(replicas)]


def predict_replicas(copies: Sequence[Sequence[StageCost]], concurrency: int, n_embd: int,
                     overheads: Overheads = DEFAULT_OVERHEADS, prefill_ratio: float = 0.0) -> Prediction:
    """Replicas serving `concurrency` streams together, each its replica_shares."""
    shares = replica_shares(concurrency, len(copies))
    each = [predict(stages, share, n_embd, overheads, prefill_ratio) for stages, share in zip(copies, shares) if share]
    return Prediction(concurrency, max(p.tpot_ms for p in each), sum(p.tok_s for p in each),
                      tuple(ms for p in each for ms in p.stage_ms), max(p.rows for p in each), len(each))
