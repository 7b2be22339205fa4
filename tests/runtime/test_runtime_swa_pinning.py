"""Negative control: gemma3 slices are exact only because the sliding-window pattern is pinned.

The tiny gemma3 has period 3 (layers 2 and 5 global). The slice of layers [1, 6) written by skippy
carries a per-layer pattern computed from the original indices. The same slice with the pattern
rewritten to the plain period 3 (what a naive slicer copying metadata would leave) applies that
period to the renumbered layers, so it makes the wrong layers global: it must diverge from the
unsplit model, past the 32-token window in particular.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import SWA, decode_logits, prompt_tokens, tiny_spec, window

from skippy.runtime.chain import LocalChain
from skippy.runtime.gguf_file import UINT32, GGUFFile, pack_entry, write_gguf
from skippy.runtime.slices import ensure_slice
from skippy.runtime.stage_runtime import StageRuntime

KEY = "gemma3.attention.sliding_window_pattern"


def unpinned_copy(slice_path: Path, dest: Path, period: int) -> Path:
    """The slice with its per-layer SWA array replaced by a plain period (every other byte copied)."""
    gguf = GGUFFile(slice_path)
    try:
        assert isinstance(gguf.get(KEY), list)
        entries = [gguf.raw_entry(k) for k in gguf.kv if k != KEY] + [pack_entry(KEY, UINT32, period)]
        plan = [(t.name, t, gguf.tensor_bytes(t)) for t in gguf.tensors]
        with dest.open("wb") as out:
            write_gguf(out, entries, plan, gguf.alignment)
        del plan
    finally:
        gguf.close()
    return dest


def run_two_stage(head: StageRuntime, tail: StageRuntime, tokens: list[int]) -> np.ndarray:
    w = [window(0, 0, tokens)]
    hidden = head.decode(w).hidden
    rows = tail.decode(w, hidden).output_rows[0]
    logits = np.stack([tail.logits(r) for r in rows])
    head.release_session(0)
    tail.release_session(0)
    return logits


@pytest.mark.parametrize(("split", "pinned_pattern"), [(1, [True, False, True, True, False]), (4, [True, False])])
def test_unpinned_swa_pattern_breaks_exactness(
    split: int, pinned_pattern: list[bool], tiny_model: Callable[..., Path], tmp_path: Path,
    unsplit_chain: Callable[[str], LocalChain], open_stage: Callable[..., StageRuntime],
) -> None:
    path = tiny_model("gemma3")
    tiny_spec(path)
    tokens = prompt_tokens(2 * SWA, seed=3)
    full = unsplit_chain("gemma3")
    expected = decode_logits(full, [window(0, 0, tokens)])[0]
    full.release(0)

    pinned = ensure_slice(path, split, 6, final=True)
    gguf = GGUFFile(pinned)
    assert gguf.get(KEY) == pinned_pattern  # original layers split..5: layer % 3 < 2 is sliding
    gguf.close()
    bad = unpinned_copy(pinned, tmp_path / "unpinned.gguf", period=3)

    head = open_stage(tiny_spec(path, layer_start=0, layer_end=split))
    good_tail = open_stage(tiny_spec(path, layer_start=split, layer_end=6))
    bad_tail = open_stage(tiny_spec(bad, layer_start=split, layer_end=6, load_mode="artifact-slice"))
    assert bad_tail.is_final

    good = run_two_stage(head, good_tail, tokens)
    assert np.array_equal(good, expected)

    wrong = run_two_stage(head, bad_tail, tokens)
    diff = np.abs(wrong - expected).max(axis=1)
    assert (diff[SWA:] > 0.1).all(), f"unpinned slice matched the model past the window: {diff[SWA:]}"
    # the damage is visible in the tokens too, not only in the last bits
    assert (wrong[SWA:].argmax(1) != expected[SWA:].argmax(1)).mean() > 0.25


def test_period_aligned_split_is_unaffected_by_pinning(
    tiny_model: Callable[..., Path], tmp_path: Path, open_stage: Callable[..., StageRuntime],
) -> None:
    """Control of the control: at split 3 (a multiple of the period) the plain period happens to be right."""
    path = tiny_model("gemma3")
    pinned = ensure_slice(path, 3, 6, final=True)
    bad = unpinned_copy(pinned, tmp_path / "unpinned3.gguf", period=3)
    tokens = prompt_tokens(2 * SWA, seed=3)
    head = open_stage(tiny_spec(path, layer_start=0, layer_end=3))
    good = run_two_stage(head, open_stage(tiny_spec(path, layer_start=3, layer_end=6)), tokens)
    same = run_two_stage(head, open_stage(tiny_spec(bad, layer_start=3, layer_end=6, load_mode="artifact-slice")), tokens)
    assert np.array_equal(good, same)
