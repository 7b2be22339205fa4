"""A non-final stage reads its last layer's output with a compiled eval callback (skippy.runtime.capture).

The build machine has a C compiler (it builds llama.cpp), so the native callback must be what stages
use; its hidden states equal the Python callback's bitwise, over a prefill and decode steps, and a
capture that does not fit its buffer is refused instead of overrunning it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import prompt_tokens, tiny_spec

import skippy.runtime.capture as capture
from skippy.runtime.capture import native_capture_library
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow


def test_the_native_callback_builds_here() -> None:
    library = native_capture_library()
    assert library is not None and library.exists()


def hidden_states(runtime: StageRuntime) -> list[np.ndarray]:
    prompt = np.array(prompt_tokens(40, seed=3), np.int32)
    out = [runtime.decode([SessionWindow(0, 0, len(prompt), (), prompt)], None).hidden]
    for step in range(4):
        window = SessionWindow(0, len(prompt) + step, 1, (), np.array([7 + step], np.int32))
        out.append(runtime.decode([window], None).hidden)
    return [np.array(h) for h in out]


def test_native_and_python_callbacks_capture_the_same_hidden_states(
        tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tiny_spec(tiny_model("gemma3"), layer_end=3)
    native = StageRuntime(spec)
    monkeypatch.setattr(capture, "_load", lambda: None)  # as on a machine without a C compiler
    python = StageRuntime(spec)
    try:
        assert (native.eval_callback, python.eval_callback) == ("native", "python")
        for a, b in zip(hidden_states(native), hidden_states(python), strict=True):
            assert a.shape == b.shape and np.array_equal(a, b)
    finally:
        native.close()
        python.close()


def test_a_capture_larger_than_its_buffer_is_refused(tiny_model: Callable[..., Path]) -> None:
    runtime = StageRuntime(tiny_spec(tiny_model("gemma3"), layer_end=3))
    try:
        native = runtime._capture_hook
        assert native is not None and native.kind == "native"
        arm = native.arm
        native.arm = lambda dest: arm(dest[:1])  # type: ignore[method-assign]  # room for one row only
        prompt = np.array(prompt_tokens(8, seed=4), np.int32)
        with pytest.raises(RuntimeError, match="captured -1 floats of layer output"):
            runtime.decode([SessionWindow(0, 0, len(prompt), (), prompt)], None)
    finally:
        runtime.close()
