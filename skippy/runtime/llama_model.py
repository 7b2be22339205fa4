"""The llama.cpp model: how its weights load (StageConfig's load knobs) and the owned `llama_model *`.

Load knobs map onto `llama_model_params`: n_gpu_layers, main_gpu, split_mode, a selected backend
device, mmap/mlock/direct I/O (llama.cpp's load mode), repack (extra buffer types), no_host,
check_tensors. llama.cpp's AMX buffer type is never used: it segfaults on Q4_K/Q8_0 weights.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as L

from skippy.runtime.errors import ModelError
from skippy.runtime.llama_backend import clear_llama_log, init_backend, last_llama_error, model_buffers

_ggml_full = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libggml.so"))  # the backend registry
_ggml_full.ggml_backend_dev_count.restype = ctypes.c_size_t
_ggml_full.ggml_backend_dev_get.restype = ctypes.c_void_p
_ggml_full.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
_ggml_full.ggml_backend_dev_by_name.restype = ctypes.c_void_p
_ggml_full.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
_ggml_full.ggml_backend_dev_type.restype = ctypes.c_int
_ggml_full.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]

_ggml_full.ggml_backend_dev_name.restype = ctypes.c_char_p
_ggml_full.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]


_SPLIT_MODES = {
    "none": L.LLAMA_SPLIT_MODE_NONE,
    "layer": L.LLAMA_SPLIT_MODE_LAYER,
    "row": L.LLAMA_SPLIT_MODE_ROW,
    "tensor": L.LLAMA_SPLIT_MODE_TENSOR,
}
_LOAD_MODE_NONE, _LOAD_MODE_MMAP, _LOAD_MODE_MLOCK, _LOAD_MODE_MMAP_MLOCK, _LOAD_MODE_DIRECT_IO = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class ModelLoadParams:
    """How llama.cpp loads the weights (StageConfig's load knobs; None = llama.cpp's default)."""

    n_gpu_layers: int = 0  # -1 = every layer
    main_gpu: int | None = None
    split_mode: str = "auto"
    device: str | None = None  # a ggml backend device name (selected_device.backend_device)
    mmap: bool | None = None
    mlock: bool = False
    direct_io: bool = False
    repack: bool | None = None  # llama.cpp's extra buffer types (use_extra_bufts)
    no_host: bool = False
    check_tensors: bool = False

    def load_mode(self, default: int) -> int:
        if self.direct_io:
            return _LOAD_MODE_DIRECT_IO
        if self.mmap is None and not self.mlock:
            return default
        if self.mmap is False:
            return _LOAD_MODE_MLOCK if self.mlock else _LOAD_MODE_NONE
        return _LOAD_MODE_MMAP_MLOCK if self.mlock else _LOAD_MODE_MMAP


def system_info() -> str:
    init_backend()
    return L.llama_print_system_info().decode("utf-8", "replace")


def amx_compiled(info: str) -> bool:
    """Whether llama.cpp was built with its AMX backend (its buffer type segfaults on Q4_K/Q8_0)."""
    return "AMX_INT8 = 1" in info


def backend_devices() -> list[str]:
    init_backend()
    return [_ggml_full.ggml_backend_dev_name(_ggml_full.ggml_backend_dev_get(i)).decode()
            for i in range(_ggml_full.ggml_backend_dev_count())]


def _device_list(name: str) -> ctypes.Array[ctypes.c_void_p]:
    """A NULL-terminated `ggml_backend_dev_t[]` holding the named device (none for the CPU)."""
    init_backend()
    dev = _ggml_full.ggml_backend_dev_by_name(name.encode())
    if not dev:
        raise ModelError(f"selected_device.backend_device {name!r} is not a llama.cpp device here"
                         f" (available: {', '.join(backend_devices())})")
    is_cpu = _ggml_full.ggml_backend_dev_type(dev) == 0  # GGML_BACKEND_DEVICE_TYPE_CPU
    return (ctypes.c_void_p * 2)(None, None) if is_cpu else (ctypes.c_void_p * 2)(dev, None)


class LlamaModel:
    """An owned `llama_model *` (mmap'd weights by default)."""

    def __init__(self, path: Path, *, vocab_only: bool = False, load: ModelLoadParams = ModelLoadParams(),
                 load_mtp: bool = False) -> None:
        init_backend()
        params = L.llama_model_default_params()
        params.vocab_only = vocab_only
        params.load_mtp = load_mtp  # NextN (MTP) blocks: skipped unless the stage drafts from them (docs/mtp.md)
        params.n_gpu_layers = load.n_gpu_layers
        if load.main_gpu is not None:
            params.main_gpu = load.main_gpu
        if load.split_mode != "auto":
            params.split_mode = _SPLIT_MODES[load.split_mode]
        params.load_mode = load.load_mode(params.load_mode)
        params.check_tensors = load.check_tensors
        params.no_host = load.no_host
        if load.repack is not None:
            params.use_extra_bufts = load.repack
        # llama.cpp's AMX buffer type segfaults in ggml_backend_amx_mul_mat on this project's Q4_K/Q8_0
        # weights; scripts/setup builds without it, but a foreign build may have it.
        self.amx_avoided = bool(params.use_extra_bufts) and not vocab_only and amx_compiled(system_info())
        if self.amx_avoided:
            params.use_extra_bufts = False
        devices = _device_list(load.device) if load.device is not None else None
        if devices is not None:
            params.devices = ctypes.addressof(devices)
        clear_llama_log()
        ptr = L.llama_model_load_from_file(str(path).encode(), params)
        if not ptr:
            raise ModelError(f"llama.cpp could not load {path}: {last_llama_error()}")
        self.ptr = ptr
        self.buffers = model_buffers()  # MiB of weights per buffer type, e.g. {"CPU_REPACK": 120.5, ...}
        if any(name.startswith("AMX") for name in self.buffers):
            self.close()
            raise ModelError(f"llama.cpp put weights of {path} in its AMX buffer type, which crashes on"
                             " Q4_K/Q8_0 tensors (llama.cpp #20824); rebuild with scripts/setup")
        self.path = path
        self.vocab = L.llama_model_get_vocab(ptr)
        self.n_embd = int(L.llama_model_n_embd(ptr))
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))

    def close(self) -> None:
        if self.ptr:
            L.llama_model_free(self.ptr)
            self.ptr = None
