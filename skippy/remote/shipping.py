"""A stage's layers sent to its host: the slice GGUF of its range, kept in the host's cache by content.

A slice is named by the model's digest and the layer range (`slices/<digest>-<start>-<end>-<final|stop>.gguf`,
as skippy.runtime.slices caches them here), so a host that has the name has those bytes: it is sent only
when missing (the probe lists what the host has: skippy.remote.probe). Sending streams the file through
`host_agent receive`, which keeps it only when its size and sha256 match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from skippy.config.ssh_target import SshTarget
from skippy.remote.ssh import run_remote
from skippy.runtime.slices import ensure_slice, file_digest

__all__ = ["SliceFile", "send_slice", "stage_slice"]


@dataclass(frozen=True)
class SliceFile:
    cache_name: str  # where it lives under any host's cache directory
    path: Path  # here
    sha256: str
    size: int


def stage_slice(model: Path, layer_start: int, layer_end: int, n_layer: int) -> SliceFile:
    """The slice of `[layer_start, layer_end)` in this machine's slice cache (written on first use)."""
    path = ensure_slice(model, layer_start, layer_end, final=layer_end == n_layer)
    return SliceFile(f"slices/{path.name}", path, file_digest(path), path.stat().st_size)


def send_slice(target: SshTarget, label: str, piece: SliceFile, remote_cache: str) -> float:
    """Stream the slice into the host's cache; returns the seconds it took."""
    started = time.monotonic()
    with piece.path.open("rb") as data:
        run_remote(target, label, ["-m", "skippy.remote.host_agent", "receive", f"{remote_cache}/{piece.cache_name}",
                                   piece.sha256, str(piece.size)], stdin=data, timeout_s=None)
    return time.monotonic() - started
