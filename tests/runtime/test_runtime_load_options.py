"""StageConfig's llama.cpp load knobs reach llama.cpp; the build has no AMX; the smoke check works.

Evidence comes from llama.cpp itself: the "<buffer> model buffer size" lines of each load say
where the weights went (CPU, CPU_REPACK, CUDA0, ...).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import N_LAYER, greedy_run, prompt_tokens, tiny_spec

from skippy.runtime.chain import LocalChain
from skippy.runtime.errors import ModelError
from skippy.runtime.llama_model import LlamaModel, ModelLoadParams, amx_compiled, backend_devices, system_info
from skippy.runtime.smoke import check as smoke_check
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime


def test_the_build_has_no_amx_backend() -> None:
    # scripts/setup builds with -mno-amx-*: on a Sapphire Rapids CPU a plain -march=native build
    # compiles the AMX backend, whose buffer type segfaults on Q4_K/Q8_0 weights.
    info = system_info()
    assert "CPU :" in info
    assert not amx_compiled(info), info


def test_amx_detection_reads_llama_system_info() -> None:
    assert amx_compiled("CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert not amx_compiled("CPU : SSE3 = 1 | AVX2 = 1 | REPACK = 1 |")


@pytest.mark.gemma
def test_repack_switches_llama_cpp_extra_buffer_types(gemma_path: Path) -> None:
    default = LlamaModel(gemma_path)
    off = LlamaModel(gemma_path, load=ModelLoadParams(repack=False))
    try:
        assert set(off.buffers) <= {"CPU", "CPU_Mapped"}, off.buffers
        if "REPACK = 1" in system_info():
            assert any("REPACK" in name for name in default.buffers), default.buffers
        assert not default.amx_avoided
    finally:
        default.close()
        off.close()


def test_knobs_that_do_not_change_the_math_keep_output_bitwise(
    tiny_model: Callable[..., Path], unsplit_chain: Callable[[str], LocalChain]
) -> None:
    base = tiny_spec(tiny_model("llama"))
    knobs = replace(base, kv_offload=False, op_offload=False, load=ModelLoadParams(
        n_gpu_layers=-1, mmap=False, check_tensors=True, no_host=True, device="CPU", split_mode="none", main_gpu=0))
    chain = LocalChain(knobs)
    try:
        assert "CPU" in chain.stages[0].model.buffers  # read into memory: no CPU_Mapped buffer
        assert "CPU_Mapped" not in chain.stages[0].model.buffers
        prompt = prompt_tokens(24, seed=7)
        tokens, logits = greedy_run(chain, prompt, 8)
        ref_tokens, ref_logits = greedy_run(unsplit_chain("llama"), prompt, 8)
        assert tokens == ref_tokens
        np.testing.assert_array_equal(logits, ref_logits)
    finally:
        chain.close()


def test_unknown_backend_device_is_refused_naming_the_devices(tiny_model: Callable[..., Path]) -> None:
    spec = tiny_spec(tiny_model("llama"), layer_end=N_LAYER, load=ModelLoadParams(device="CUDA7"))
    with pytest.raises(ModelError, match=r"selected_device.backend_device 'CUDA7' is not a llama.cpp device here"
                                         r" \(available: .*CPU"):
        StageRuntime(spec)


def test_gpu_offload_when_a_gpu_is_present(tiny_model: Callable[..., Path]) -> None:
    gpus = [name for name in backend_devices() if not name.upper().startswith("CPU")]
    if not gpus:
        pytest.skip(f"no GPU device in this llama.cpp build (devices: {', '.join(backend_devices())});"
                    " build with CMAKE_ARGS=-DGGML_CUDA=on scripts/setup to test offload")
    stage = StageRuntime(tiny_spec(tiny_model("llama"), layer_end=N_LAYER, load=ModelLoadParams(n_gpu_layers=-1, device=gpus[0])))
    try:
        assert any(not name.upper().startswith("CPU") for name in stage.model.buffers), stage.model.buffers
    finally:
        stage.close()


def test_source_model_identity_is_checked(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("llama")
    size, digest = path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()
    base = tiny_spec(path, layer_end=N_LAYER)
    with pytest.raises(ModelError, match=rf"{size} bytes, but source_model_bytes is {size + 1}"):
        StageRuntime(replace(base, source_bytes=size + 1))
    with pytest.raises(ModelError, match=r"but source_model_sha256 is 00"):
        StageRuntime(replace(base, source_sha256="00" * 32))
    StageRuntime(replace(base, source_bytes=size, source_sha256=digest.upper())).close()


def test_smoke_check_decodes_in_a_child(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    ok, verdict = smoke_check(str(tiny_model("llama")), n_tokens=2)
    assert ok, verdict
    assert "llama.cpp system info" in verdict
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 60)
    ok, verdict = smoke_check(str(broken), n_tokens=2)
    assert not ok
    assert verdict.startswith("smoke check: failed with exit code 1: ") and "broken.gguf" in verdict


def test_runtime_spec_defaults_leave_llama_defaults() -> None:
    spec = RuntimeSpec(model_path=None, layer_start=0, layer_end=1)
    assert spec.load == ModelLoadParams() and spec.kv_offload is None and spec.op_offload is None
    assert ModelLoadParams().load_mode(default=-1) == -1
    assert ModelLoadParams(mmap=False).load_mode(-1) == 0
    assert ModelLoadParams(mlock=True).load_mode(-1) == 3  # mmap + mlock
    assert ModelLoadParams(mmap=False, mlock=True).load_mode(-1) == 2
    assert ModelLoadParams(direct_io=True).load_mode(-1) == 4
