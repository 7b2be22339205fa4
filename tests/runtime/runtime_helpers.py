"""Plain helpers for the runtime tests: build windows, run them through a chain, collect logits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from skippy.runtime.chain import LocalChain, layer_ranges
from skippy.runtime.errors import ModelError
from skippy.runtime.slices import check_range, read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.windows import SessionWindow

N_LAYER = 6  # layers of the tiny models
TINY_CTX = 128
TINY_OUTPUTS = 64  # n_outputs_max: enough for logits at every position of a 48-token prompt
SWA = 32  # the tiny gemma3's sliding window


def tiny_spec(path: object, **overrides: object) -> RuntimeSpec:
    """The base spec every tiny-model chain uses (RuntimeSpec defaults otherwise: 4 lanes)."""
    values: dict[str, object] = {"layer_start": 0, "layer_end": 0, "ctx_size": TINY_CTX, "n_outputs_max": TINY_OUTPUTS}
    values.update(overrides)
    return RuntimeSpec(model_path=path, **values)  # type: ignore[arg-type]


def split_refusal(path: object, split_points: Sequence[int]) -> str:
    """Why the family's rules refuse this split of the model ('' when they allow it)."""
    info = read_model_info(path)  # type: ignore[arg-type]
    for start, end in layer_ranges(info.n_layer, list(split_points)):
        try:
            check_range(info, start, end)
        except ModelError as exc:
            return str(exc)
    return ""


def refused_as_the_rules_say(open_chain: Callable[..., LocalChain], path: Path, split_points: Sequence[int]) -> bool:
    """True when the family's rules refuse the split, after checking the chain's load refuses it so."""
    refusal = split_refusal(path, split_points)
    if refusal:
        with pytest.raises(ModelError) as refused:
            open_chain(tiny_spec(path), split_points)
        assert str(refused.value) == refusal
    return bool(refusal)


def allowed_split(path: Path, *candidates: Sequence[int]) -> list[int]:
    """The first of the candidate splits the family's rules allow."""
    return list(next(c for c in candidates if not split_refusal(path, c)))


def prompt_tokens(n: int, seed: int, n_vocab: int = 400) -> list[int]:
    """n deterministic token ids in [3, n_vocab) (skips unk/bos/eos)."""
    return np.random.default_rng(seed).integers(3, n_vocab, n).tolist()


def window(session_id: int, pos: int, tokens: Sequence[int], outputs: Sequence[int] | str = "all") -> SessionWindow:
    """A token window; outputs "all" = logits at every offset, "last" = only the last one."""
    toks = np.asarray(tokens, np.int32)
    n = len(toks)
    outs = tuple(range(n)) if outputs == "all" else (n - 1,) if outputs == "last" else tuple(outputs)
    return SessionWindow(session_id, pos, n, outs, toks)


def decode_logits(chain: LocalChain, windows: list[SessionWindow]) -> list[np.ndarray]:
    """Decode one batch; per window, float32[len(outputs), n_vocab] (copies)."""
    rows = chain.decode(windows)
    n_vocab = chain.final.n_vocab
    return [np.stack([chain.final.logits(r) for r in rs]) if rs else np.empty((0, n_vocab), np.float32) for rs in rows]


def release_all(chain: LocalChain, session_ids: Sequence[int]) -> None:
    for sid in session_ids:
        chain.release(sid)


def greedy_run(chain: LocalChain, prompt: Sequence[int], steps: int, session_id: int = 0) -> tuple[list[int], np.ndarray]:
    """Prefill with logits at every position, then `steps` single-token greedy steps (argmax).

    Returns the generated tokens and float32[len(prompt) + steps, n_vocab]: every logit row seen.
    """
    try:
        rows = [decode_logits(chain, [window(session_id, 0, prompt)])[0]]
        tokens: list[int] = []
        pos = len(prompt)
        for _ in range(steps):
            tokens.append(int(np.argmax(rows[-1][-1])))
            rows.append(decode_logits(chain, [window(session_id, pos, [tokens[-1]])])[0])
            pos += 1
        return tokens, np.concatenate(rows)
    finally:
        chain.release(session_id)


def batched_greedy(chain: LocalChain, prompts: Sequence[Sequence[int]], outputs: Sequence[str], steps: int,
                   first_id: int = 0) -> tuple[list[list[int]], list[np.ndarray]]:
    """All prompts prefilled in ONE batch, then `steps` batches of one 1-token window per session.

    Tokens are the argmax of each session's last logits. Returns per session the generated tokens
    and every logit row it produced (prefill outputs then one row per step).
    """
    ids = [first_id + i for i in range(len(prompts))]
    try:
        prefill = decode_logits(chain, [window(s, 0, p, o) for s, p, o in zip(ids, prompts, outputs)])
        logits: list[list[np.ndarray]] = [[x] for x in prefill]
        tokens: list[list[int]] = [[] for _ in prompts]
        for step in range(steps):
            batch = []
            for i, (sid, p) in enumerate(zip(ids, prompts)):
                tokens[i].append(int(np.argmax(logits[i][-1][-1])))
                batch.append(window(sid, len(p) + step, [tokens[i][-1]]))
            for i, out in enumerate(decode_logits(chain, batch)):
                logits[i].append(out)
        return tokens, [np.concatenate(rows) for rows in logits]
    finally:
        release_all(chain, ids)


def top2_margin(logits: np.ndarray) -> np.ndarray:
    """Per row: best logit minus second best."""
    top = np.sort(logits, axis=-1)[..., -2:]
    return top[..., 1] - top[..., 0]
