"""A stage's layers sent to its host: the slice GGUF of its range, kept in the host's cache by content.

A slice is named by the model's digest and the layer range (`slices/<digest>-<start>-<end>-<final|stop>.gguf`,
as skippy.runtime.slices caches them here), so a host that has the name has those bytes: it is sent only
when missing (the probe lists what the host has: skippy.remote.probe). Sending streams the file's data through
`host_agent receive`, which keeps it only when its size and sha256 match: a slice's tensors its stage never reads
are holes (skippy.runtime.slices), found with SEEK_DATA / SEEK_HOLE, and only the ranges between them travel.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from skippy.config.ssh_target import SshTarget
from skippy.remote.ssh import run_remote
from skippy.runtime.slices import ensure_slice, file_digest

__all__ = ["SliceFile", "data_ranges", "send_slice", "slice_file", "stage_slice"]


@dataclass(frozen=True)
class SliceFile:
    cache_name: str  # where it lives under any host's cache directory
    path: Path  # here
    sha256: str
    size: int
    data: tuple[tuple[int, int], ...]  # the byte ranges that are not holes

    @property
    def data_bytes(self) -> int:
        return sum(end - start for start, end in self.data)


def data_ranges(path: Path) -> tuple[tuple[int, int], ...]:
    """The file's [start, end) ranges that hold data, holes left out (the whole file where holes are not reported)."""
    ranges, size = [], path.stat().st_size
    with path.open("rb") as f:
        fd, offset = f.fileno(), 0
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            ranges.append((start, end))
            offset = end
    return tuple(ranges)


def slice_file(path: Path) -> SliceFile:
    """A file of this machine's slice cache, as it is sent (its name there, digest, size and data ranges)."""
    return SliceFile(f"slices/{path.name}", path, file_digest(path), path.stat().st_size, data_ranges(path))


def stage_slice(model: Path, layer_start: int, layer_end: int, n_layer: int) -> SliceFile:
    """The slice of `[layer_start, layer_end)` in this machine's slice cache (written on first use)."""
    return slice_file(ensure_slice(model, layer_start, layer_end, final=layer_end == n_layer))


def send_slice(target: SshTarget, label: str, piece: SliceFile, remote_cache: str) -> float:
    """Stream the slice's data into the host's cache; returns the seconds it took."""
    started = time.monotonic()
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "wb") as out, piece.path.open("rb") as data:
            try:
                for start, end in piece.data:
                    data.seek(start)
                    left = end - start
                    while left > 0 and (chunk := data.read(min(left, 1 << 20))):
                        out.write(chunk)
                        left -= len(chunk)
            except BrokenPipeError:
                pass  # the receiver is gone; run_remote reports why

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    ranges = ",".join(f"{start}:{end}" for start, end in piece.data)
    try:
        with os.fdopen(read_end, "rb") as stdin:
            run_remote(target, label, ["-m", "skippy.remote.host_agent", "receive",
                                       f"{remote_cache}/{piece.cache_name}", piece.sha256, str(piece.size),
                                       "--data", ranges], stdin=stdin, timeout_s=None)
    finally:
        feeder.join(30)
    return time.monotonic() - started
