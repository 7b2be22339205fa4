"""A non-final stage's eval callback, compiled: llama.cpp calls it for every graph node.

A slice reads its last layer's output with the context's eval callback (skippy.runtime.stage_runtime).
llama.cpp asks the callback about every node of the graph, hundreds of times a decode; as a ctypes
callback into Python that cost a large share of a non-final stage's decode (measured:
docs/measurements.md, 'Stage eval callback'), so `capture.c` does the same in C. It is built once with
the system C compiler ($CC or cc) against the installed llama.cpp's libggml-base into
~/.cache/skippy/capture/<key>/ (or $SKIPPY_CACHE_DIR); `scripts/setup` builds it ahead. Without a
compiler `eval_capture()` gives the Python callback (same results). Either way: `callback` and
`user_data` go into the context params; `arm` before each decode, `floats` after it (-1: the tensor
did not fit the buffer).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import llama_cpp as L
import numpy as np

from skippy.runtime.llama_api import copy_tensor, tensor_name

__all__ = ["NativeCapture", "PythonCapture", "eval_capture", "native_capture_library"]

_SOURCE = Path(__file__).with_name("capture.c")
_LIBDIR = Path(L.__file__).parent / "lib"


class _Target(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("dest", ctypes.c_void_p), ("cap_bytes", ctypes.c_size_t),
                ("copied", ctypes.c_size_t), ("overflow", ctypes.c_int)]


class NativeCapture:
    """One context's capture of tensor `name` by the compiled callback."""

    kind = "native"

    def __init__(self, library: ctypes.CDLL, name: bytes) -> None:
        if len(name) >= 64:
            raise ValueError(f"tensor name {name!r} is too long for the capture target")
        self._target = _Target(name=name)
        self.callback = ctypes.cast(library.skippy_capture_eval, L.ggml_backend_sched_eval_callback)
        self.user_data = ctypes.cast(ctypes.pointer(self._target), ctypes.c_void_p)
        self._dest: np.ndarray | None = None  # kept alive while llama.cpp may write into it

    def arm(self, dest: np.ndarray) -> None:
        assert dest.dtype == np.float32 and dest.flags.c_contiguous
        self._dest = dest
        self._target.dest, self._target.cap_bytes = dest.ctypes.data, dest.nbytes
        self._target.copied, self._target.overflow = 0, 0

    def floats(self) -> int:
        return -1 if self._target.overflow else self._target.copied // 4


class PythonCapture:
    """The same capture as a ctypes callback into Python (no C compiler on this machine)."""

    kind = "python"

    def __init__(self, name: bytes) -> None:
        self._name = name
        self._dest = np.empty(0, np.float32)
        self._copied = 0
        self.callback = L.ggml_backend_sched_eval_callback(self._on_eval)
        self.user_data: ctypes.c_void_p | None = None

    def arm(self, dest: np.ndarray) -> None:
        self._dest, self._copied = dest.reshape(-1), 0

    def floats(self) -> int:
        return self._copied

    def _on_eval(self, tensor: int, ask: bool, _user: ctypes.c_void_p) -> bool:  # must never raise
        if tensor_name(tensor) != self._name:
            return not ask  # not wanted; when observing, keep going
        if ask:
            return True
        if self._copied >= 0:  # each ubatch brings its rows
            try:
                self._copied += copy_tensor(tensor, self._dest[self._copied :])
            except Exception:  # noqa: BLE001 - a raise here would unwind through C; mark the capture bad
                self._copied = -1
        return False  # stop: the stop block and the vocabulary projection are not needed


def eval_capture(name: bytes) -> NativeCapture | PythonCapture:
    """A capture of tensor `name`: compiled when possible."""
    library = _load()
    return PythonCapture(name) if library is None else NativeCapture(library, name)


def native_capture_library() -> Path | None:
    """The built library (building it if needed), or None when no C compiler is available."""
    return _build()


@cache
def _load() -> ctypes.CDLL | None:
    path = _build()
    return None if path is None else ctypes.CDLL(str(path))


@cache
def _build() -> Path | None:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + str(_LIBDIR.resolve()).encode() + L.__version__.encode()).hexdigest()[:16]
    root = Path(os.environ.get("SKIPPY_CACHE_DIR", Path.home() / ".cache" / "skippy"))
    target = root / "capture" / key / "libskippy_capture.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", str(_SOURCE), "-o", str(partial), f"-L{_LIBDIR}",
                        "-lggml-base", f"-Wl,-rpath,{_LIBDIR}"], check=True, capture_output=True, timeout=120)
        os.replace(partial, target)  # atomic: concurrent builders each write their own file
    except (OSError, subprocess.SubprocessError):
        partial.unlink(missing_ok=True)
        return None
    return target
