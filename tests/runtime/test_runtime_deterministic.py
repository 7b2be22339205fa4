"""`deterministic`: with one llama.cpp context per lane, a row's logits are bitwise the same alone, in any
batch company, inside a verify window, after a released session's hole and after a prefix cache restore.

The default model (SmolLM2-135M-Instruct Q4_1), the whole model in one runtime; real prompts. The shared
context's differences these settings remove are measured by scripts/batch-invariance (docs/deterministic.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from skippy.protocol import PrefixRef
from skippy.runtime.invariance import PROMPTS
from skippy.runtime.lane_contexts import SPLIT_KV_SAFE
from skippy.runtime.models import SMOLLM2
from skippy.runtime.slices import read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.tokenizer import Tokenizer
from skippy.runtime.windows import SessionWindow

LANES = 6


@pytest.fixture(scope="module")
def det() -> Iterator[tuple[StageRuntime, list[list[int]]]]:
    path = SMOLLM2.path()
    n_layer = read_model_info(path).n_layer
    runtime = StageRuntime(RuntimeSpec(model_path=path, layer_start=0, layer_end=n_layer, lane_count=LANES,
                                       ctx_size=512, prefix_entries=2, deterministic=True))
    tok = Tokenizer(runtime.model)
    # session 0 runs past 256 positions (n_kv 512: the KV-split kernel); its one-row decodes get the padding row
    prompts = [tok.encode(" ".join([PROMPTS[i]] * (24 if i == 0 else 1))) for i in range(LANES)]
    assert len(prompts[0]) > 256 > SPLIT_KV_SAFE
    yield runtime, prompts
    runtime.close()


def _window(session: int, pos: int, tokens: list[int], **extra: object) -> SessionWindow:
    return SessionWindow(session, pos, len(tokens), tuple(range(len(tokens))), np.asarray(tokens, np.int32),
                         **extra)  # type: ignore[arg-type]


def _rows(runtime: StageRuntime, windows: list[SessionWindow]) -> list[list[np.ndarray]]:
    result = runtime.decode(windows)
    return [[runtime.logits(r) for r in rows] for rows in result.output_rows]


def _prefill(runtime: StageRuntime, prompts: list[list[int]], sessions: range) -> None:
    for s in sessions:
        runtime.decode([SessionWindow(s, 0, len(prompts[s]), (), np.asarray(prompts[s], np.int32))])


def test_a_row_ignores_its_batch_company_and_its_window(det: tuple[StageRuntime, list[list[int]]]) -> None:
    runtime, prompts = det
    _prefill(runtime, prompts, range(LANES))
    nxt = [p[-1] for p in prompts]
    for pos_shift in (0, -120):  # past SPLIT_KV_SAFE (padded) and before it, both sessions long and short
        starts = [len(p) + (pos_shift if s == 0 else 0) for s, p in enumerate(prompts)]
        alone = _rows(runtime, [_window(0, starts[0], [nxt[0]])])[0][0]
        for k in (2, LANES):
            company = _rows(runtime, [_window(s, starts[s], [nxt[s]]) for s in range(k)])
            assert np.array_equal(company[0][0], alone), (pos_shift, k)
        draft = prompts[1][:5]
        window = _rows(runtime, [_window(0, starts[0], draft), _window(2, starts[2], [nxt[2]])])[0]
        singles = [_rows(runtime, [_window(0, starts[0] + i, [t])])[0][0] for i, t in enumerate(draft)]
        assert all(np.array_equal(a, b) for a, b in zip(window, singles, strict=True)), pos_shift
    runtime.release_session(0)


def test_a_prefix_cache_restore_gives_the_same_bits(det: tuple[StageRuntime, list[list[int]]]) -> None:
    runtime, prompts = det
    prompt = prompts[3]
    _prefill(runtime, prompts, range(4, 5))
    ref = PrefixRef(key=77, n_tokens=len(prompt) - 1)
    runtime.decode([SessionWindow(4, 0, len(prompt) - 1, (), np.asarray(prompt[:-1], np.int32), record=(ref,))])
    fresh = _rows(runtime, [_window(4, len(prompt) - 1, prompt[-1:] + prompts[2][:3])])[0]
    runtime.release_session(5)
    _prefill(runtime, prompts, range(5, 6))  # another session takes the lane and cells first
    restored = _rows(runtime, [_window(5, len(prompt) - 1, prompt[-1:] + prompts[2][:3], restore=ref)])[0]
    assert all(np.array_equal(a, b) for a, b in zip(fresh, restored, strict=True))


def test_a_first_stage_takes_a_verify_window_with_more_outputs_than_lanes(tiny_model: Callable[..., Path]) -> None:
    """A non-final stage keeps no logits: a window's outputs (here 5 rows on a 1-lane stage, whose contexts
    reserve 1 output row) are the final stage's to produce (llama.cpp asserts n_outputs <= n_outputs_max)."""
    runtime = StageRuntime(RuntimeSpec(model_path=tiny_model("llama"), layer_start=0, layer_end=3, lane_count=1,
                                       ctx_size=64, deterministic=True))
    try:
        result = runtime.decode([_window(1, 0, [5, 6, 7, 8, 9])])
        assert result.hidden is not None and result.hidden.shape == (5, runtime.n_embd)
        assert result.output_rows == [[]]
    finally:
        runtime.close()
