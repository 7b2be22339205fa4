"""What a split is chosen for (`--plan-for`): decode rounds, a long prompt's prefill, or both, as an agent has them.

- `decode`: the shortest round at the target concurrency, i.e. the most tok/s there
  (skippy.plan.predict.predict);
- `prefill`: the shortest prefill of one `--plan-prompt-tokens` prompt, its chunks pipelined down the stages
  (skippy.plan.predict.prefill_ms): the stages' layer work balanced, the head (one row) nearly free;
- `mixed` (the default of `skippy plan` and `skippy up`): an agent's request, a long prompt and a short answer:
  that prompt's prefill plus `--plan-reply-tokens` rounds at the target concurrency.

A score is milliseconds, lower is better. Replicas (one whole-model pipeline per host) run a prompt on one host,
so their prefill is one host's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from skippy.config.errors import ConfigError
from skippy.plan.costs import DEFAULT_OVERHEADS, Overheads
from skippy.plan.predict import StageCost, predict, predict_replicas, prefill_ms

__all__ = ["DECODE", "DEFAULT_OBJECTIVE", "OBJECTIVES", "Objective"]

OBJECTIVES = ("decode", "prefill", "mixed")
DEFAULT_OBJECTIVE = "mixed"  # `skippy plan` and `skippy up`: people run agents (long prompts, short answers)
AGENT_PROMPT_TOKENS = 8192  # an agent's request: a coding agent's first request is 6k-20k tokens...
AGENT_REPLY_TOKENS = 256  # ...and its answer short


@dataclass(frozen=True)
class Objective:
    kind: str = "decode"
    prompt_tokens: int = AGENT_PROMPT_TOKENS
    reply_tokens: int = AGENT_REPLY_TOKENS

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise ConfigError(f"--plan-for must be one of {', '.join(OBJECTIVES)}, got '{self.kind}'")
        if self.prompt_tokens < 1:
            raise ConfigError(f"--plan-prompt-tokens must be >= 1, got {self.prompt_tokens}")
        if self.reply_tokens < 1:
            raise ConfigError(f"--plan-reply-tokens must be >= 1, got {self.reply_tokens}")

    @property
    def prefills(self) -> bool:
        """Whether a prompt's prefill counts (the search then also weighs splits balanced for it)."""
        return self.kind != "decode"

    def describe(self, concurrency: int) -> str:
        if self.kind == "decode":
            return f"the most tok/s at {concurrency} stream(s)"
        if self.kind == "prefill":
            return f"the shortest prefill of a {self.prompt_tokens}-token prompt"
        return (f"an agent's request: a {self.prompt_tokens}-token prompt's prefill + {self.reply_tokens} tokens at"
                f" {concurrency} stream(s)")

    def score(self, stages: Sequence[StageCost], concurrency: int, n_embd: int, overheads: Overheads = DEFAULT_OVERHEADS,
              prefill_ratio: float = 0.0) -> float:
        """A split's predicted ms for this objective."""
        tpot = predict(stages, concurrency, n_embd, overheads, prefill_ratio).tpot_ms if self.kind != "prefill" else 0.0
        if self.kind == "decode":
            return tpot
        return prefill_ms(stages, self.prompt_tokens, n_embd, overheads) + self.reply_tokens * tpot

    def replicas_score(self, copies: Sequence[Sequence[StageCost]], concurrency: int, n_embd: int,
                       overheads: Overheads = DEFAULT_OVERHEADS, prefill_ratio: float = 0.0) -> float:
        """Replicas' predicted ms: a prompt prefills on one of them (the slowest, to be safe)."""
        tpot = predict_replicas(copies, concurrency, n_embd, overheads, prefill_ratio).tpot_ms
        if self.kind == "decode":
            return tpot
        prefill = max(prefill_ms(c, self.prompt_tokens, n_embd, overheads) for c in copies)
        return prefill + (self.reply_tokens * tpot if self.kind == "mixed" else 0.0)


DECODE = Objective()
