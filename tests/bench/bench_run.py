"""Running `skippy bench KIND` from a test: in its own process group, killed whole (its servers and stages too) if it
overruns, so a test that times out leaves nothing running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

SKIPPY = str(Path(sys.executable).with_name("skippy"))


def run_bench(kind: str, flags: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`skippy bench KIND FLAGS`, its stdout and stderr."""
    proc = subprocess.Popen([SKIPPY, "bench", kind, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
