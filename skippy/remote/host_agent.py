"""The remote end of a stage started over SSH, run there as `python -m skippy.remote.host_agent`.

`launch DIR` reads one JSON line from stdin: `files` (path under DIR -> text and mode: the topology, the stage
config, the stage's own secret key at 0600), `env` (added to the stage's environment) and `args` (`skippy stage
...`, paths relative to DIR). It writes the files, starts the stage in DIR, copies the stage's ready line to its
stdout (then nothing more goes there) and lets the stage log to its stderr, which SSH carries back into the run
directory. Its stdin is the session: when it ends (the SSH client stopped or the connection dropped), stays silent
for `SILENCE_S` (the relay writes a newline every few seconds: a host cut off from it notices though TCP would not
for hours) or a signal comes, the stage gets SIGTERM, then SIGKILL after `STOP_GRACE_S`; the stage also gets
SIGTERM if this process dies (PR_SET_PDEATHSIG). It exits with the stage's exit status (128 + N for signal N) and
removes DIR (the secret key with it).

`receive PATH SHA256 SIZE [--data START:END,...]` writes stdin to PATH atomically, only when exactly SIZE bytes with
that sha256 came (a slice shipped into the host's cache: skippy.remote.shipping); with `--data`, stdin carries only
those byte ranges of the file, in order, and the rest is zeros, left as holes.

`calibrate MODEL SHA256 CACHE_DIR [--refresh]` gives the model's cost table measured on this host
(skippy.plan.calibrate, cached under CACHE_DIR by the model's digest, the llama.cpp build and the machine) as one JSON
line: the model's sha256, the table (none when MODEL is not the model of that SHA256) and whether it was cached
(skippy.remote.host_costs).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from skippy.launcher import die_with_parent
from skippy.log import READY_FD_ENV

STOP_GRACE_S = 15.0
SILENCE_S = 30.0  # no byte on stdin for this long: the other end is gone


def write_files(directory: Path, files: dict[str, dict[str, Any]]) -> None:
    root = directory.resolve()
    for name, spec in files.items():
        path = (root / name).resolve()
        if root not in path.parents:
            raise ValueError(f"file {name!r} is outside {root}")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        mode = int(spec.get("mode", 0o644))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), mode)  # an existing file keeps its old mode otherwise
            out.write(spec["text"])


class StageUnderSession:
    """The stage process, stopped once when the session ends or a signal comes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._once = threading.Lock()

    def stop(self) -> None:
        if not self._once.acquire(blocking=False):
            return
        threading.Thread(target=self._stop, daemon=True).start()

    def _stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def stop_when_input_ends(self) -> None:
        while select.select([0], [], [], SILENCE_S)[0] and os.read(0, 65536):
            pass
        self.stop()


def _ready_line(fd: int) -> bytes:
    data = b""
    while b"\n" not in data and (chunk := os.read(fd, 65536)):
        data += chunk
    return data.split(b"\n", 1)[0] + b"\n" if b"\n" in data else b""


def launch(directory: Path) -> int:
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0  # the session ended before it said what to start
    header = json.loads(line)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        write_files(directory, header["files"])
        read_fd, write_fd = os.pipe()
        env = {**os.environ, **header["env"], READY_FD_ENV: str(write_fd)}
        proc = subprocess.Popen([sys.executable, "-m", "skippy.cli.main", *header["args"]], cwd=directory, env=env,
                                stdin=subprocess.DEVNULL, stdout=2, stderr=2, pass_fds=(write_fd,),
                                preexec_fn=die_with_parent)
        os.close(write_fd)
        stage = StageUnderSession(proc)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda *_: stage.stop())
        threading.Thread(target=stage.stop_when_input_ends, daemon=True).start()
        ready = _ready_line(read_fd)
        os.close(read_fd)
        with contextlib.suppress(OSError):  # the client may be gone already
            os.write(1, ready)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the local end stops reading after the ready line
        code = proc.wait()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            directory.parent.rmdir()  # the run's directory, once its last stage there is gone
    return code if code >= 0 else 128 - code


def _zeros(digest: Any, length: int) -> None:
    block = bytes(min(length, 1 << 20))
    while length > 0:
        digest.update(block[:length])
        length -= len(block)


def receive(path: Path, sha256: str, size: int, data: list[tuple[int, int]] | None = None) -> int:
    ranges = data if data is not None else [(0, size)]  # without --data, stdin carries the whole file
    ends = [0, *(x for r in ranges for x in r), size]
    if any(a > b for a, b in zip(ends, ends[1:])):
        print(f"{path.name}: data ranges {ranges} are not in order within {size} bytes; not kept", file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    digest, got, expected = hashlib.sha256(), 0, sum(end - start for start, end in ranges)
    try:
        with partial.open("wb") as out:
            for start, end in ranges:
                _zeros(digest, start - out.tell())  # a hole: left unwritten
                out.seek(start)
                while out.tell() < end and (chunk := sys.stdin.buffer.read(min(end - out.tell(), 1 << 20))):
                    digest.update(chunk)
                    out.write(chunk)
                    got += len(chunk)
            _zeros(digest, size - out.tell())
            out.truncate(size)
        if got != expected or sys.stdin.buffer.read(1) or digest.hexdigest() != sha256:
            print(f"{path.name}: received {got} bytes of data with sha256 {digest.hexdigest()[:16]}, expected"
                  f" {expected} of a {size}-byte file with {sha256[:16]}; not kept", file=sys.stderr)
            return 1
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return 0


def _ranges(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(",") if part)]


def calibrate(model: Path, sha256: str, cache_dir: str, refresh: bool) -> int:
    os.environ["SKIPPY_CACHE_DIR"] = os.path.expanduser(cache_dir)
    from skippy.plan.calibrate import calibrated_costs, cost_cache_path  # noqa: PLC0415  (llama.cpp: only here)
    from skippy.runtime.slices import file_digest  # noqa: PLC0415

    found = file_digest(model) if model.is_file() else None
    if found != sha256:
        print(json.dumps({"sha256": found, "costs": None}))
        return 0
    path = cost_cache_path(model, "all")
    cached = path.is_file() and not refresh
    calibrated_costs(model, "all", refresh=refresh)
    print(json.dumps({"sha256": found, "cached": cached, "name": path.name, "costs": json.loads(path.read_text())}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m skippy.remote.host_agent")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("launch").add_argument("directory", type=Path)
    p = sub.add_parser("receive")
    p.add_argument("path", type=Path)
    p.add_argument("sha256")
    p.add_argument("size", type=int)
    p.add_argument("--data", type=_ranges, default=None, help="the byte ranges stdin carries (START:END,...)")
    p = sub.add_parser("calibrate")
    p.add_argument("model", type=Path)
    p.add_argument("sha256")
    p.add_argument("cache_dir")
    p.add_argument("--refresh", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "launch":
        return launch(args.directory)
    if args.command == "calibrate":
        return calibrate(args.model.expanduser(), args.sha256, args.cache_dir, args.refresh)
    return receive(args.path, args.sha256, args.size, args.data)


if __name__ == "__main__":
    sys.exit(main())
