"""Batch invariance probe: does a row's logits depend on what else llama.cpp evaluates with it?

Loads a whole model in one llama.cpp context (the same context shape a stage uses: unified KV, full
SWA cache) and compares logits bitwise between evaluations of the same token row:

- `company`: one session's decode row alone, then inside batches of 2..9 rows (other sessions' rows);
- `window`: a speculative verify window of k+1 rows of one session against the same rows one by one;
- `placement`: the same session and positions with its KV cells laid out in another cell order
  (a hole left by a released session in front of its cells).

`probe(...)` returns one `Finding` per case; `scripts/batch-invariance` (`python -m skippy.runtime.invariance`)
prints them for several context settings, and docs/deterministic.md explains each difference with the
llama.cpp source lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from skippy.runtime.llama_api import BatchBuffers, ContextParams, LlamaContext
from skippy.runtime.llama_model import LlamaModel, ModelLoadParams
from skippy.runtime.tokenizer import Tokenizer

PROMPTS = (
    "The capital of France is Paris. The capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Name three colors that appear in a rainbow and explain why the sky looks blue during the day.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "SELECT name, COUNT(*) FROM users GROUP BY name ORDER BY",
    "Water boils at 100 degrees Celsius at sea level because",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In 1969, Neil Armstrong became the first person to",
    "A list of prime numbers: 2, 3, 5, 7, 11, 13,",
)


@dataclass(frozen=True)
class Finding:
    """One comparison: `identical` rows of `rows` compared, and the largest absolute logit difference."""

    case: str
    rows: int
    identical: int
    max_abs_diff: float


class Probe:
    """A whole-model context with one lane per prompt, each prompt's KV prefilled (padding first with `pad`)."""

    def __init__(self, model: LlamaModel, params: ContextParams, prompts: Sequence[Sequence[int]],
                 pad: int = 0) -> None:
        self.ctx = LlamaContext(model, params)
        self.n_vocab = model.n_vocab
        self.buf = BatchBuffers(params.n_batch, params.n_seq_max)
        self.prompts = [list(p) for p in prompts]
        pad_lane = len(self.prompts)
        if pad:  # a released session's cells in front of everything: later cells may land before earlier ones
            self.run([(pad_lane, 0, [self.prompts[0][0]] * pad)], outputs=False)
        for lane, tokens in enumerate(self.prompts):
            self.run([(lane, 0, tokens)], outputs=False)
        if pad:
            self.ctx.seq_rm(pad_lane, 0)

    def run(self, windows: Sequence[tuple[int, int, Sequence[int]]], *, outputs: bool = True) -> list[np.ndarray]:
        """Decode `(lane, pos_start, tokens)` windows in one llama_decode; logits of every row (if `outputs`)."""
        n = sum(len(t) for _, _, t in windows)
        lanes = np.empty(n, np.int32)
        row = 0
        for lane, pos, tokens in windows:
            end = row + len(tokens)
            lanes[row:end] = lane
            self.buf.pos[row:end] = np.arange(pos, pos + len(tokens), dtype=np.int32)
            self.buf.token[row:end] = tokens
            row = end
        self.buf.logits[:n] = 1 if outputs else 0
        if not outputs:
            self.buf.logits[n - 1] = 1
        self.ctx.decode(self.buf.build(n, lanes))
        return [self.ctx.logits_row(i, self.n_vocab).copy() for i in range(n)] if outputs else []

    def trim(self) -> None:
        for lane, tokens in enumerate(self.prompts):
            self.ctx.seq_rm(lane, len(tokens))

    def close(self) -> None:
        self.ctx.close()


def _compare(case: str, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> Finding:
    same = sum(1 for a, b in pairs if np.array_equal(a, b))
    diff = max(float(np.max(np.abs(a - b))) for a, b in pairs)
    return Finding(case, len(pairs), same, diff)


def company(probe: Probe, max_rows: int = 9) -> Finding:
    """Session 0's next row alone against the same row inside batches of 2..max_rows rows."""
    nxt = [p[-1] for p in probe.prompts]
    alone = probe.run([(0, len(probe.prompts[0]), [nxt[0]])])[0]
    probe.trim()
    pairs = []
    for k in range(2, min(max_rows, len(probe.prompts)) + 1):
        rows = probe.run([(lane, len(probe.prompts[lane]), [nxt[lane]]) for lane in range(k)])
        probe.trim()
        pairs.append((alone, rows[0]))
    return _compare("company", pairs)


def window(probe: Probe, draft: Sequence[int]) -> Finding:
    """A verify window of len(draft) rows of session 0 against the same rows decoded one at a time."""
    start = len(probe.prompts[0])
    together = probe.run([(0, start, list(draft))])
    probe.trim()
    one_by_one = [probe.run([(0, start + i, [t])])[0] for i, t in enumerate(draft)]
    probe.trim()
    return _compare(f"window{len(draft)}", list(zip(together, one_by_one, strict=True)))


def probe(model_path: Path, *, flash_attn: str, n_threads: int, n_ubatch: int, repack: bool | None = None,
          prompts: Sequence[str] = PROMPTS, draft_len: int = 4, repeat: int = 1) -> list[Finding]:
    """All cases for one context setting (`repeat` lengthens every prompt, so the KV holds over 512 cells)."""
    model = LlamaModel(model_path, load=ModelLoadParams(repack=repack))
    tok = Tokenizer(model)
    ids = [tok.encode(" ".join([p] * repeat)) for p in prompts]
    params = ContextParams(n_ctx=4096, n_seq_max=len(ids) + 1, n_batch=256, n_ubatch=n_ubatch,
                           n_threads=n_threads, n_outputs_max=256, flash_attn_type=flash_attn)
    findings = []
    try:
        ordered = Probe(model, params, ids)
        findings.append(company(ordered))
        draft = ids[1][:draft_len]
        findings.append(window(ordered, draft))
        start = len(ids[0])
        in_order = ordered.run([(0, start, draft)])
        ordered.close()
        holed = Probe(model, params, ids, pad=64)
        # session 0's prompt sits after the hole; its new cells fill the hole, in front of its own prompt
        findings.append(_compare("placement", list(zip(in_order, holed.run([(0, start, draft)]), strict=True))))
        holed.close()
    finally:
        model.close()
    return findings


SETTINGS = (  # (flash attention, threads, n_ubatch, prompt repeats): short KV (256 cells) and long (768)
    ("disabled", 2, 32, 1), ("enabled", 2, 32, 1), ("enabled", 2, 512, 1), ("enabled", 1, 32, 1),
    ("disabled", 2, 32, 6), ("enabled", 2, 32, 6), ("enabled", 2, 512, 6), ("enabled", 1, 32, 6),
)


def main(argv: Sequence[str]) -> int:
    from skippy.runtime.models import resolve_model_path  # noqa: PLC0415

    path = resolve_model_path(argv[0] if argv else "smollm2-135m")
    print(f"{path.name}: rows bitwise identical / compared (largest |logit difference|)")
    for flash_attn, threads, ubatch, repeat in SETTINGS:
        found = probe(path, flash_attn=flash_attn, n_threads=threads, n_ubatch=ubatch, repeat=repeat)
        cells = "  ".join(f"{f.case} {f.identical}/{f.rows} ({f.max_abs_diff:.2g})" for f in found)
        print(f"flash_attn {flash_attn:<8} threads {threads} n_ubatch {ubatch:<3} prompts x{repeat}:  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
