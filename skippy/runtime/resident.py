"""Dropping the pages of a loaded model file that a stage does not use, so its RSS is what it touches.

llama.cpp maps a GGUF with MAP_POPULATE: every page of the slice file is in the process's page table
after loading, the whole token embedding included, although stage 0 only gathers the rows of the tokens
it sees, a middle stage never reads it, the stop block never runs and weights that llama.cpp repacked
live in anonymous memory after load. `drop_mapped_pages` tells the kernel (madvise MADV_DONTNEED) that
the process no longer needs the file's shared read-only mappings: the page-table entries go, the page
cache keeps the data, and whatever the stage reads later faults back in from it (minor faults, once).
Safe for any shared read-only file mapping: it is re-read from the unchanged file, never lost. Linux
only; elsewhere (or when /proc is absent) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

__all__ = ["drop_mapped_pages"]

_MADV_DONTNEED = 4


def drop_mapped_pages(path: Path) -> int:
    """Drop this process's resident pages of the shared read-only mappings of `path`; returns bytes advised."""
    maps = Path("/proc/self/maps")
    if not maps.is_file():
        return 0
    target = os.path.realpath(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    for line in maps.read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or parts[5] != target or parts[1] != "r--s":
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
            advised += end - start
    return advised
