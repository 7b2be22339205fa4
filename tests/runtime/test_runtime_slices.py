"""The slice writer: cache reuse, progress, slice metadata and tensors, artifact slices."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import decode_logits, prompt_tokens, split_refusal, tiny_spec, window

import skippy.runtime.slices as slices
from skippy.runtime.chain import LocalChain
from skippy.runtime.errors import ModelError
from skippy.runtime.families import FAMILIES as FAMILIES_BY_ARCH
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.layer_kinds import missing_kind, stop_block
from skippy.runtime.slices import ensure_slice, file_digest, read_model_info, slice_cache_dir, write_slice
from skippy.runtime.stage_runtime import StageRuntime
from skippy.testing.tiny_families import FAMILY_SPECS
from skippy.testing.tiny_models import FAMILIES

PATTERN = "gemma3.attention.sliding_window_pattern"


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty slice cache for this test only."""
    monkeypatch.setenv("SKIPPY_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "slices"


def test_ensure_slice_writes_once_then_reuses(own_cache: Path, tiny_model: Callable[..., Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_model("qwen3")
    first = ensure_slice(path, 2, 4, final=False)
    assert first.parent == own_cache == slice_cache_dir()
    assert first.name == f"{file_digest(path)[:16]}-2-4-stop.lean.gguf"
    mtime = first.stat().st_mtime_ns

    def no_rewrite(*args: object, **kwargs: object) -> Path:
        raise AssertionError("ensure_slice rewrote a cached slice")

    original = slices.write_slice
    monkeypatch.setattr(slices, "write_slice", no_rewrite)
    again = ensure_slice(path, 2, 4, final=False)
    assert again == first and again.stat().st_mtime_ns == mtime
    # the same range as a final slice is another file (without the stop block)
    with pytest.raises(AssertionError, match="rewrote"):
        ensure_slice(path, 2, 4, final=True)
    monkeypatch.setattr(slices, "write_slice", original)
    assert ensure_slice(path, 2, 4, final=True).name.endswith("-2-4-final.lean.gguf")
    assert sorted(p.name for p in own_cache.glob("*.gguf")) == sorted([first.name, first.name.replace("stop", "final")])
    assert not list(own_cache.glob("*.tmp"))  # written atomically, nothing left behind


def test_runtime_reuses_the_cached_slice(own_cache: Path, tiny_model: Callable[..., Path],
                                         open_stage: Callable[..., StageRuntime]) -> None:
    path = tiny_model("llama")
    open_stage(tiny_spec(path, layer_start=3, layer_end=6))
    (cached,) = own_cache.glob("*.gguf")
    mtime = cached.stat().st_mtime_ns
    open_stage(tiny_spec(path, layer_start=3, layer_end=6))
    assert list(own_cache.glob("*.gguf")) == [cached] and cached.stat().st_mtime_ns == mtime
    open_stage(tiny_spec(path, layer_start=0, layer_end=6))  # the whole model: loaded as is, no slice
    assert list(own_cache.glob("*.gguf")) == [cached]


def test_progress_reaches_the_total(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    dest = write_slice(tiny_model("gemma3"), tmp_path / "s.gguf", 1, 4, final=False,
                       progress=lambda done, total: calls.append((done, total)))
    assert len(calls) > 3
    totals = {total for _, total in calls}
    assert len(totals) == 1
    total = totals.pop()
    dones = [done for done, _ in calls]
    assert dones == sorted(dones) and dones[-1] == total
    gguf = GGUFFile(dest)
    assert total == sum(t.nbytes for t in gguf.tensors)
    gguf.close()


def test_progress_through_the_runtime(own_cache: Path, tiny_model: Callable[..., Path]) -> None:
    calls: list[tuple[int, int]] = []
    chain = LocalChain(tiny_spec(tiny_model("qwen2"), lane_count=1), [3], progress=lambda d, t: calls.append((d, t)))
    chain.close()
    assert calls and all(0 < d <= t for d, t in calls)
    assert sum(d == t for d, t in calls) == 2  # two slices written, each reported complete


def blocks(gguf: GGUFFile) -> dict[int, dict[str, object]]:
    out: dict[int, dict[str, object]] = {}
    for t in gguf.tensors:
        if t.name.startswith("blk."):
            _, index, suffix = t.name.split(".", 2)
            out.setdefault(int(index), {})[suffix] = t
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("start", "end", "final"), [(0, 2, False), (1, 4, False), (2, 3, False), (4, 6, True), (5, 6, True)])
def test_slice_metadata_and_tensors(family: str, start: int, end: int, final: bool,
                                    tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = tiny_model(family)
    info = read_model_info(path)
    refusal = split_refusal(path, [start] if start else [])
    if refusal or (final and missing_kind(info.required_layers, start, end)):  # the family's rules refuse it
        with pytest.raises(ModelError, match=f"{family} "):
            write_slice(path, tmp_path / "s.gguf", start, end, final=final)
        return
    dest = write_slice(path, tmp_path / "s.gguf", start, end, final=final)
    src, sl = GGUFFile(path), GGUFFile(dest)
    try:
        # + the stop block: a copy of the last layer, or of the kind of layer the slice lacks; a final slice
        # carries the NextN (MTP) blocks instead (mimo2), a non-final one drops them and their count
        tail = list(range(info.n_layer, info.n_block)) if final else [stop_block(info.required_layers, start, end)]
        owned = list(range(start, end)) + tail
        nextn_key = f"{family}.nextn_predict_layers"
        assert sl.get(nextn_key) == (src.get(nextn_key) if final else None)
        assert sl.get("skippy.slice.layer_start") == start
        assert sl.get("skippy.slice.layer_end") == end
        assert sl.get("skippy.slice.stop_block") is (not final)
        assert sl.get("skippy.slice.source_digest") == file_digest(path)
        assert sl.get("skippy.slice.source_n_layer") == 6
        assert sl.get(f"{family}.block_count") == len(owned)
        assert sl.get("general.architecture") == family
        pattern = f"{family}.attention.sliding_window_pattern"
        per_layer = {f"{family}.attention.head_count_kv"} if FAMILY_SPECS[family].attention_period else set()
        dropped = {f"{family}.{key}" for key in FAMILIES_BY_ARCH[family].token_input_keys} if start else set()
        assert not dropped & set(sl.kv)  # token-embedding scales stay with stage 0
        for key in src.kv:  # everything else is copied unchanged
            if key not in {f"{family}.block_count", pattern, f"{family}.attention.sliding_window", *per_layer, *dropped,
                           nextn_key}:
                assert sl.raw_entry(key) == src.raw_entry(key), key
        for key in per_layer:  # cut to the slice's layers, by their original indices
            assert sl.get(key) == [src.get(key)[il] for il in owned]  # type: ignore[index]

        src_blocks, sl_blocks = blocks(src), blocks(sl)
        assert sorted(sl_blocks) == list(range(len(owned)))
        for new, old in enumerate(owned):  # renumbered from 0, bytes of the original block
            assert sl_blocks[new].keys() == src_blocks[old].keys()
            for suffix, t in sl_blocks[new].items():
                assert bytes(sl.tensor_bytes(t)) == bytes(src.tensor_bytes(src_blocks[old][suffix])), (new, suffix)
        src_rest = {t.name: bytes(src.tensor_bytes(t)) for t in src.tensors if not t.name.startswith("blk.")}
        sl_rest = {t.name: bytes(sl.tensor_bytes(t)) for t in sl.tensors if not t.name.startswith("blk.")}
        tied = "output.weight" not in src_rest
        unused = {"output.weight"} if not final else set()  # a non-final stage stops before the head
        if start and (not final or (not tied and not info.n_nextn)):  # a later stage's input is a hidden state
            unused.add("token_embd.weight")
        unused &= set(src_rest)
        assert sl.get("skippy.slice.zeroed") == ",".join(sorted(unused))
        assert sl_rest.keys() == src_rest.keys()
        for name, data in sl_rest.items():  # what the stage reads kept, the rest zeros (a hole on disk)
            assert data == (bytes(len(src_rest[name])) if name in unused else src_rest[name]), name

        if not FAMILY_SPECS[family].sliding_window:
            assert sl.get(pattern) is None
            return
        swa = [il % 3 < 2 and il < info.n_layer for il in owned]  # tiny gemma3, cohere2, mimo2: period 3, layers 2
        # and 5 global (and the NextN block)
        if any(swa):
            assert sl.get(pattern) == swa  # pinned to the ORIGINAL layer indices, stop block included
            assert sl.get(f"{family}.attention.sliding_window") == 32
        else:  # only global layers: llama.cpp rejects SWA without SWA layers, so the window is dropped
            assert sl.get(pattern) is None and sl.get(f"{family}.attention.sliding_window") is None
    finally:
        src.close()
        sl.close()


@pytest.mark.gemma
@pytest.mark.parametrize(("start", "end", "final", "global_at"), [(9, 18, True, [2, 8]), (5, 13, False, [0, 6])])
def test_gemma_default_period_is_pinned_as_an_array(start: int, end: int, final: bool, global_at: list[int],
                                                    gemma_path: Path) -> None:
    """The real model has no pattern key (llama.cpp's default period 6: layers 5, 11, 17 global)."""
    src = GGUFFile(gemma_path)
    assert src.get(PATTERN) is None and src.get("gemma3.block_count") == 18
    src.close()
    sl = GGUFFile(ensure_slice(gemma_path, start, end, final=final))  # cached by the gemma tests
    try:
        owned = list(range(start, end)) + ([] if final else [end - 1])
        assert sl.get(PATTERN) == [il % 6 < 5 for il in owned]
        assert [i for i, swa in enumerate(sl.get(PATTERN)) if not swa] == global_at  # original 11, 17 / 5, 11
        assert sl.get("gemma3.block_count") == len(owned)
        assert sl.get("gemma3.attention.sliding_window") == 512
    finally:
        sl.close()


@pytest.mark.parametrize("family", ["gemma3", "qwen2"])
def test_artifact_slices_equal_runtime_slices(family: str, tiny_model: Callable[..., Path], tmp_path: Path,
                                              open_chain: Callable[..., LocalChain],
                                              open_stage: Callable[..., StageRuntime]) -> None:
    path = tiny_model(family)
    head_file = write_slice(path, tmp_path / "head.gguf", 0, 2, final=False)
    tail_file = write_slice(path, tmp_path / "tail.gguf", 2, 6, final=True)
    head = open_stage(tiny_spec(head_file, layer_start=0, layer_end=2, load_mode="artifact-slice"))
    tail = open_stage(tiny_spec(tail_file, layer_start=2, layer_end=6, load_mode="artifact-slice"))
    assert (head.is_first, head.is_final, tail.is_first, tail.is_final) == (True, False, False, True)
    assert head.model_digest == tail.model_digest == file_digest(path)

    tokens = prompt_tokens(48, seed=50)
    w = [window(0, 0, tokens)]
    rows = tail.decode(w, head.decode(w).hidden).output_rows[0]
    got = np.stack([tail.logits(r) for r in rows])

    chain = open_chain(tiny_spec(path), [2])
    expected = decode_logits(chain, w)[0]
    chain.release(0)
    assert np.array_equal(got, expected)
