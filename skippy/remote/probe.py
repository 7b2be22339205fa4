"""What a host has for skippy, asked over SSH before any stage starts there.

Run there as `PYTHON -c <this file's text> CACHE_DIR [FILE ...]`: standard library only, so it answers where
skippy is missing. It prints one JSON line: the Python version, skippy's version and `source_digest` of its
package (None when that Python has no skippy), CACHE_DIR made absolute (and created), MemAvailable in bytes,
and the size of each FILE (a path under CACHE_DIR) that is there. `skippy.remote.ssh_stages` compares the
digest with this checkout's, so a host runs exactly the skippy that plans for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import metadata, util
from pathlib import Path


def source_digest(package_dir: Path) -> str:
    """sha256 over the package's Python sources (relative path and text of each, in order)."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def skippy_identity() -> tuple[str | None, str | None]:
    """(version, source digest) of the skippy this Python imports; (None, None) when it has none."""
    spec = util.find_spec("skippy")
    if spec is None or not spec.submodule_search_locations:
        return None, None
    try:
        version = metadata.version("skippy")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return version, source_digest(Path(next(iter(spec.submodule_search_locations))))


def available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def answer(cache_dir: str, files: list[str]) -> dict[str, object]:
    cache = Path(os.path.expanduser(cache_dir)).absolute()
    cache.mkdir(parents=True, exist_ok=True)
    version, digest = skippy_identity()
    have = {name: (cache / name).stat().st_size for name in files if (cache / name).is_file()}
    return {"python": ".".join(map(str, sys.version_info[:3])), "skippy": version, "source_digest": digest,
            "cache_dir": str(cache), "mem_available": available_memory(), "have": have}


if __name__ == "__main__":
    print(json.dumps(answer(sys.argv[1], sys.argv[2:])))
