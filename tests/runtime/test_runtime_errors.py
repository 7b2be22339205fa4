"""Bad models and bad requests fail with ModelError / RuntimeUsageError naming the file or the field."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from runtime_helpers import decode_logits, tiny_spec, window

from skippy.runtime.chain import LocalChain, layer_ranges
from skippy.runtime.errors import ModelError, RuntimeUsageError
from skippy.runtime.slices import write_slice
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow


@pytest.fixture
def llama(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("llama")


# -- model files --------------------------------------------------------------------------------


def test_missing_model_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelError, match=f"model file not found: {re.escape(str(missing))}"):
        StageRuntime(tiny_spec(missing, layer_end=6))
    with pytest.raises(ModelError, match="model file not found"):
        LocalChain(tiny_spec(missing))


def test_random_bytes_are_not_a_gguf(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelError, match=rf"{re.escape(str(junk))}: not a readable GGUF file .*bad magic"):
        LocalChain(tiny_spec(junk))


@pytest.mark.parametrize("keep", [0.5, 0.02, 10], ids=["half", "header-cut", "magic-only"])
def test_truncated_model(keep: float, llama: Path, tmp_path: Path) -> None:
    data = llama.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)] if keep < 1 else data[: int(keep)])
    with pytest.raises(ModelError, match=rf"{re.escape(str(cut))}: not a readable GGUF file"):
        StageRuntime(tiny_spec(cut, layer_end=6))


def test_half_a_model_names_the_missing_tensor_data(llama: Path, tmp_path: Path) -> None:
    data = llama.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="tensor data runs past the end of the file"):
        LocalChain(tiny_spec(cut), [3])


def write_arch_only(path: Path, arch: str, **keys: int) -> Path:
    """A GGUF with only a header: skippy reads metadata before anything else."""
    w = GGUFWriter(path, arch)
    for name, value in keys.items():
        getattr(w, f"add_{name}")(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture(tmp_path: Path) -> None:
    gpt2 = write_arch_only(tmp_path / "gpt2.gguf", "gpt2", block_count=2, embedding_length=8)
    supported = r"\(supported: llama, gemma3, qwen2, qwen3, phi3, .*, lfm2; what each needs of a split: docs/families\.md\)"
    with pytest.raises(ModelError, match=r"gpt2\.gguf: unsupported architecture 'gpt2' " + supported):
        LocalChain(tiny_spec(gpt2), [1])
    with pytest.raises(ModelError, match="unsupported architecture 'gpt2'"):
        StageRuntime(tiny_spec(gpt2, layer_end=2))


def test_supported_architecture_without_block_count(tmp_path: Path) -> None:
    bare = write_arch_only(tmp_path / "bare.gguf", "llama")
    with pytest.raises(ModelError, match=r"bare\.gguf: missing llama\.block_count or llama\.embedding_length"):
        LocalChain(tiny_spec(bare))


# -- layer ranges and split points --------------------------------------------------------------


@pytest.mark.parametrize(("start", "end"), [(0, 7), (3, 3), (4, 2), (-1, 3), (6, 7)])
def test_layer_range_outside_the_model(start: int, end: int, llama: Path) -> None:
    with pytest.raises(ModelError, match=rf"layer range \[{start}, {end}\) is outside {llama.name}, which has 6 layers"):
        StageRuntime(tiny_spec(llama, layer_start=start, layer_end=end))


@pytest.mark.parametrize("points", [[4, 2], [3, 3], [0], [6], [2, 9], [-1]])
def test_split_points_must_increase_inside_the_model(points: list[int], llama: Path) -> None:
    message = (rf"split points {re.escape(str(points))} must be strictly increasing layer indices in 1\.\.5"
               r" \(the model has 6 layers\)")
    with pytest.raises(ModelError, match=message):
        layer_ranges(6, points)
    with pytest.raises(ModelError, match=message):
        LocalChain(tiny_spec(llama), points)


def test_layer_ranges() -> None:
    assert layer_ranges(18, [9]) == [(0, 9), (9, 18)]
    assert layer_ranges(18, [5, 13]) == [(0, 5), (5, 13), (13, 18)]
    assert layer_ranges(6, []) == [(0, 6)]


def test_unknown_load_mode(llama: Path) -> None:
    with pytest.raises(ModelError, match=r"unknown load_mode 'mmap' \(runtime-slice \| artifact-slice\)"):
        StageRuntime(tiny_spec(llama, layer_end=6, load_mode="mmap"))


# -- artifact slices ----------------------------------------------------------------------------


def test_artifact_slice_mode_needs_a_slice(llama: Path) -> None:
    with pytest.raises(ModelError, match=rf"{re.escape(str(llama))}: not a slice written by `skippy slice`"):
        StageRuntime(tiny_spec(llama, layer_start=0, layer_end=6, load_mode="artifact-slice"))


def test_artifact_slice_of_another_range(llama: Path, tmp_path: Path) -> None:
    sliced = write_slice(llama, tmp_path / "s.gguf", 0, 3, final=False)
    with pytest.raises(ModelError, match=r"s\.gguf: slice holds layers \[0, 3\), config asks for \[0, 2\)"):
        StageRuntime(tiny_spec(sliced, layer_start=0, layer_end=2, load_mode="artifact-slice"))
    with pytest.raises(ModelError, match=r"slice holds layers \[0, 3\), config asks for \[3, 6\)"):
        StageRuntime(tiny_spec(sliced, layer_start=3, layer_end=6, load_mode="artifact-slice"))


# -- requests -----------------------------------------------------------------------------------


@pytest.fixture
def tail(llama: Path, open_stage: Callable[..., StageRuntime]) -> StageRuntime:
    """A final stage fed hidden states: layers [3, 6)."""
    return open_stage(tiny_spec(llama, layer_start=3, layer_end=6))


@pytest.mark.parametrize(
    "make_hidden",
    [
        lambda n, d: np.zeros((n, d + 1), np.float32),
        lambda n, d: np.zeros((n + 1, d), np.float32),
        lambda n, d: np.zeros((n * d,), np.float32),
        lambda n, d: np.zeros((n, d), np.float64),
        lambda n, d: None,
    ],
    ids=["wide", "extra-row", "flat", "float64", "none"],
)
def test_hidden_input_of_the_wrong_shape(make_hidden: Callable[[int, int], np.ndarray | None], tail: StageRuntime) -> None:
    w = [SessionWindow(0, 0, 4, (3,))]
    with pytest.raises(RuntimeUsageError, match=rf"hidden input must be float32\[4, {tail.n_embd}\], got"):
        tail.decode(w, make_hidden(4, tail.n_embd))
    assert tail.active_sessions == []  # refused before anything was touched
    result = tail.decode(w, np.zeros((4, tail.n_embd), np.float32))  # the right shape works
    assert result.hidden is None and result.output_rows == [[3]]
    tail.release_session(0)


@pytest.mark.parametrize("tokens", [None, np.array([1, 2], np.int32)], ids=["none", "too-few"])
def test_first_stage_needs_token_ids(tokens: np.ndarray | None, unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("llama")
    with pytest.raises(RuntimeUsageError, match=r"session 0: the first stage needs 3 token ids"):
        chain.decode([SessionWindow(0, 0, 3, (2,), tokens)])
    assert chain.final.active_sessions == []


@pytest.mark.parametrize(("pos", "n"), [(120, 9), (128, 1), (0, 129)])
def test_window_past_ctx_size(pos: int, n: int, unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("llama")
    assert chain.final.spec.ctx_size == 128
    with pytest.raises(RuntimeUsageError, match=rf"positions \[{pos}, {pos + n}\) outside the context of 128 \(ctx_size\)"):
        chain.decode([window(0, pos, [5] * n, "last")])


def test_a_window_reaching_ctx_size_exactly_is_fine(unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("llama")
    try:
        decode_logits(chain, [window(0, 0, [5] * 127, "last")])
        decode_logits(chain, [window(0, 127, [6])])
        assert chain.final.session_length(0) == 128
    finally:
        chain.release(0)


def test_bad_batches(unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("llama")
    with pytest.raises(RuntimeUsageError, match="empty batch"):
        chain.decode([])
    with pytest.raises(RuntimeUsageError, match="a session appears twice in one batch"):
        chain.decode([window(0, 0, [5]), window(0, 1, [6])])
    with pytest.raises(RuntimeUsageError, match=r"session 0: output offsets \(3,\) outside the window"):
        chain.decode([window(0, 0, [5, 6, 7], (3,))])
    with pytest.raises(RuntimeUsageError, match=r"session 0: positions \[-1, 0\)"):
        chain.decode([window(0, -1, [5])])
    with pytest.raises(RuntimeUsageError, match=r"batch asks for 65 output rows, more than n_outputs_max 64"):
        chain.decode([window(0, 0, [5] * 40), window(1, 0, [6] * 25)])
    assert chain.final.active_sessions == []


def test_batch_larger_than_n_batch(llama: Path, open_chain: Callable[..., LocalChain]) -> None:
    chain = open_chain(tiny_spec(llama, n_batch=16, n_ubatch=16))
    with pytest.raises(RuntimeUsageError, match="batch of 17 rows exceeds n_batch 16"):
        chain.decode([window(0, 0, [5] * 17, "last")])


def test_generate_needs_a_prompt(unsplit_chain: Callable[[str], LocalChain]) -> None:
    with pytest.raises(ModelError, match="empty prompt"):
        list(unsplit_chain("llama").generate([], 4))
