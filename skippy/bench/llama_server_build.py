"""llama.cpp's own `llama-server`, built once from the llama.cpp sources vendored in the llama-cpp-python sdist.

The same llama.cpp commit as the installed llama-cpp-python (its sdist, `pip download --no-binary`), the same
flags as `scripts/setup` uses for the wheel: Release, `-DGGML_NATIVE=ON`, shared libraries, OpenMP, the user's
`CMAKE_ARGS`, and on x86-64 `-mno-amx-int8 -mno-amx-tile -mno-amx-bf16` (llama.cpp's AMX kernels crash on Q4_K). Only the
`llama-server` and `ggml-rpc-server` targets are built (`-j2`; the RPC backend on, for the split-across-hosts peer),
without the web UI (no npm, no download at build time) or OpenSSL.
The build lives in `~/.cache/skippy/llama-server-<version>-<key>` (or `$SKIPPY_CACHE_DIR`), keyed like
`scripts/setup` keys its wheel (version, CMake flags, this CPU's feature flags); a `built` stamp marks a
finished build, which every later run reuses (the unpacked sources are then removed). Progress (`[n/N]`
steps) goes to stderr, the full log to `build.log` beside it. A failed build raises
`LlamaServerBuildError` naming the step, with the log's tail. `python -m skippy.bench.llama_server_build`
builds it (or finds the cached one) and prints its path: what `.ci/run` does before the tests.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

__all__ = ["LlamaServerBuildError", "build_dir", "cmake_args", "ensure_llama_server_binary", "ensure_rpc_server_binary",
           "llama_server_version"]

NO_AMX = "-mno-amx-int8 -mno-amx-tile -mno-amx-bf16"
# llama.cpp's CMake options (vendor/llama.cpp/CMakeLists.txt, tools/ui/CMakeLists.txt) for a server-only build
SERVER_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DGGML_RPC=ON",
)
TARGETS = ("llama-server", "ggml-rpc-server")
_STEP = re.compile(rb"^\[(\d+)/(\d+)\]")


class LlamaServerBuildError(RuntimeError):
    """The llama-server build failed; the message names the step, the reason and the log."""


def llama_version() -> str:
    return metadata.version("llama-cpp-python")


def cmake_args() -> list[str]:
    """The user's CMAKE_ARGS plus the AMX switch-off on x86-64 (as scripts/setup), then the server options."""
    user = shlex.split(os.environ.get("CMAKE_ARGS", ""))
    if platform.machine() == "x86_64" and not any(a.startswith(("-DCMAKE_C_FLAGS", "-DCMAKE_CXX_FLAGS")) for a in user):
        user += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    return [*user, *SERVER_OPTIONS]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.strip() for line in f if line.startswith(("flags", "Features"))), platform.machine())
    except OSError:
        return platform.machine()


def build_dir() -> Path:
    """The cache directory of this version + flags + CPU."""
    key = hashlib.sha256("\n".join([llama_version(), *cmake_args(), _cpu_flags()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("SKIPPY_CACHE_DIR") or Path.home() / ".cache" / "skippy")
    return cache / f"llama-server-{llama_version()}-{key}"


def _say(text: str, end: str = "\n") -> None:
    print(text, end=end, file=sys.stderr, flush=True)


def _run(step: str, cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    """Run one build step, its output appended to `log`; `[n/N]` progress on stderr."""
    _say(f"bench: llama-server build: {step}")
    start = time.monotonic()
    with log.open("ab") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if match := _STEP.match(line):
                done, total = int(match.group(1)), int(match.group(2))
                _say(f"\r  [{done}/{total}] {time.monotonic() - start:5.0f} s", end="")
        code = proc.wait()
    if time.monotonic() - start > 2:
        _say(f"\r  done in {time.monotonic() - start:.0f} s          ")
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-25:]
        raise LlamaServerBuildError(f"llama-server build failed at '{step}' (exit {code}; full log {log}):\n"
                                    + "\n".join(tail))


def _sources(root: Path, log: Path) -> Path:
    """The sdist's vendor/llama.cpp, downloaded and unpacked into `root/src` (once)."""
    src = root / "src"
    vendored = src / f"llama_cpp_python-{llama_version()}" / "vendor" / "llama.cpp"
    if (vendored / "CMakeLists.txt").exists():
        return vendored
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    _run(f"download the llama-cpp-python {llama_version()} sdist",
         [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          f"llama-cpp-python=={llama_version()}", "-d", str(src)], log)
    archive = next(src.glob("llama_cpp_python-*.tar.gz"), None)
    if archive is None:
        raise LlamaServerBuildError(f"pip download left no llama_cpp_python-*.tar.gz in {src} (log {log})")
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    archive.unlink()
    if not (vendored / "CMakeLists.txt").exists():
        raise LlamaServerBuildError(f"the sdist has no vendor/llama.cpp/CMakeLists.txt (looked in {vendored})")
    return vendored


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One build at a time per cache directory (a second bench waits, then reuses it)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_llama_server_binary() -> Path:
    """The cached `llama-server` for this version, flags and CPU; built first if there is none (minutes)."""
    root = build_dir()
    binary, stamp = root / "build" / "bin" / "llama-server", root / "built"
    if stamp.exists() and all((root / "build" / "bin" / t).exists() for t in TARGETS):
        return binary
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise LlamaServerBuildError(f"building llama-server needs `{tool}` on PATH")
    with _locked(root):
        if stamp.exists() and all((root / "build" / "bin" / t).exists() for t in TARGETS):
            return binary
        log = root / "build.log"
        log.write_text("")
        _say(f"bench: building llama.cpp's llama-server once into {root} (~5-10 min on 2 cores; log {log})")
        source = _sources(root, log)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run("configure (cmake)", ["cmake", "-S", str(source), "-B", str(root / "build"), *generator, *cmake_args()], log)
        _run(f"compile targets {', '.join(TARGETS)} (-j2)",
             ["cmake", "--build", str(root / "build"), "--target", *TARGETS, "-j", "2"], log)
        for target in TARGETS:
            if not (root / "build" / "bin" / target).exists():
                raise LlamaServerBuildError(f"the build finished but {root / 'build' / 'bin' / target} is missing "
                                            f"(log {log})")
        stamp.write_text(shlex.join(cmake_args()) + "\n")
        shutil.rmtree(root / "src", ignore_errors=True)  # 200+ MB; the shared libraries live in build/bin
    return binary


def ensure_rpc_server_binary() -> Path:
    """llama.cpp's `ggml-rpc-server` (a host's share of an RPC split), built beside `llama-server`."""
    return ensure_llama_server_binary().parent / "ggml-rpc-server"


def llama_server_version(binary: Path | None = None) -> str:
    """`llama-server --version`'s version line, e.g. "version: 1 (0c1e570)" -> "1 (0c1e570)" (of `binary`, default
    the one built here)."""
    out = subprocess.run([str(binary or ensure_llama_server_binary()), "--version"], capture_output=True, text=True,
                         timeout=60)
    line = next((ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("version:")), "version: ?")
    return line.removeprefix("version:").strip()


def main() -> int:
    try:
        print(ensure_llama_server_binary())
    except LlamaServerBuildError as exc:
        print(f"llama-server build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
