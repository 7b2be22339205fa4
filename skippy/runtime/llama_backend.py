"""llama.cpp's process-wide state: backend initialisation once per process, and its log lines.

llama.cpp only logs why a load or a context failed, so its warnings and errors are kept (the last
few) to be quoted in the error, and the "model buffer size" lines of a load say where the weights went.
"""

from __future__ import annotations

import collections
import ctypes
import re
import threading

import llama_cpp as L

__all__ = ["clear_llama_log", "init_backend", "last_llama_error", "model_buffers"]

_init_lock = threading.Lock()
_initialised = False
# Recent llama.cpp warnings/errors, quoted when a load fails (llama.cpp only logs the reason).
_recent_log: collections.deque[str] = collections.deque(maxlen=8)
# "<buffer type> model buffer size = <MiB>" lines of the last load: where the weights went.
_BUFFER_LINE = re.compile(r"(\S+) model buffer size =\s*([0-9.]+) MiB")
_model_buffers: dict[str, float] = {}
_LOG_WARN, _LOG_ERROR = 3, 4  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR


@L.llama_log_callback
def _log_sink(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    if not text:
        return
    line = text.decode("utf-8", "replace").strip()
    if level in (_LOG_WARN, _LOG_ERROR):
        _recent_log.append(line)
    elif (match := _BUFFER_LINE.search(line)) is not None:
        _model_buffers[match.group(1)] = float(match.group(2))


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its logging away from stderr."""
    global _initialised
    with _init_lock:
        if not _initialised:
            L.llama_log_set(_log_sink, None)
            L.llama_backend_init()
            _initialised = True


def clear_llama_log() -> None:
    _recent_log.clear()
    _model_buffers.clear()


def model_buffers() -> dict[str, float]:
    """MiB of weights per llama.cpp buffer type (CPU, CPU_REPACK, CUDA0, ...) in the last load."""
    return dict(_model_buffers)


def last_llama_error() -> str:
    return _recent_log[-1] if _recent_log else "no reason logged"
