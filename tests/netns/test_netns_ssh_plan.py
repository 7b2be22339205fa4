"""`skippy plan --hosts` over SSH hosts: each host is priced by a cost table measured on it.

Two namespace hosts reached only over SSH (sshd_helpers), each with a cache directory of its own. h1 names the model
at a path it has (`ssh.model_path`: the namespaces share this machine's files); h2 names none. `skippy plan` checks
h1, runs the calibration there, keeps the table in h1's cache and brings it back into this machine's cost cache; h2
is sent the model's skeleton (its header: every tensor is a hole, so a few MB of a 98 MB model travel) and measured
on it there. A second plan measures and sends nothing (the tables are cached there, by the digest of what was timed
and the llama.cpp build). A `model_path` that is another model is refused in one line naming
the host, and nothing is measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from netns_helpers import MakeHosts
from sshd_helpers import SshHost, sshd_hosts

from skippy.remote.shipping import data_ranges
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import file_digest

SHAPE = ["--model", "smollm2-135m", "--lane-count", "2", "--ctx-size", "256"]


def plan(hosts_file: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skippy.cli.main", "plan", "--hosts", str(hosts_file), *SHAPE],
                          capture_output=True, text=True, timeout=1200, env={**os.environ, "SKIPPY_CACHE_DIR": str(cache)})


def write_hosts(path: Path, hosts: list[SshHost], h1_model: Path) -> Path:
    entries: list[dict[str, Any]] = [{**hosts[0].entry("h1", model_path=str(h1_model)), "mem_mb": 150},
                                     {**hosts[1].entry("h2"), "mem_mb": 150}]
    path.write_text(json.dumps({"hosts": entries}))
    return path


def tables(host: SshHost) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (host.cache_dir / "plan").glob("*.json")}


def test_a_host_with_the_model_is_priced_by_a_table_measured_there(
        netns_hosts: MakeHosts, tmp_path: Path, skippy_cache_dir: Path) -> None:
    model = resolve_model_path("smollm2-135m")
    with sshd_hosts(netns_hosts(2, emulator="none"), tmp_path / "ssh") as hosts:
        hosts_file = write_hosts(tmp_path / "hosts.json", hosts, model)
        first = plan(hosts_file, skippy_cache_dir)
        assert first.returncode == 0, first.stderr
        assert "h1: cost table measured there" in first.stderr, first.stderr
        assert "h2: cost table measured there (on SmolLM2-135M-Instruct.Q4_1.gguf's skeleton" in first.stderr, first.stderr
        measured, measured2 = tables(hosts[0]), tables(hosts[1])
        assert len(measured) == 1 and len(measured2) == 1, (measured, measured2)
        for name, table in (("h1", measured), ("h2", measured2)):  # brought back here, named by host and table
            assert (skippy_cache_dir / "plan" / f"{name}-{next(iter(table))}").is_file(), name
        skeleton = hosts[1].cache_dir / "slices" / f"{file_digest(model)[:16]}.skeleton.gguf"  # and its calibration's slices
        assert 0 <= skeleton.stat().st_size - model.stat().st_size <= 4096  # the model, one metadata key more
        assert sum(end - start for start, end in data_ranges(skeleton)) < model.stat().st_size / 10  # holes
        assert "split into 2" in first.stdout, first.stdout

        again = plan(hosts_file, skippy_cache_dir)
        assert again.returncode == 0, again.stderr
        assert "h1: cost table cached there" in again.stderr and "h2: cost table cached there" in again.stderr
        assert "measured there" not in again.stderr, again.stderr
        assert tables(hosts[0]) == measured and tables(hosts[1]) == measured2

        other = resolve_model_path("gemma3-270m")
        refused = plan(write_hosts(tmp_path / "other.json", hosts, other), skippy_cache_dir)
        assert refused.returncode == 2
        last = refused.stderr.strip().splitlines()[-1]
        assert "host h1" in last and f"{other} is another model" in last, refused.stderr
        assert tables(hosts[0]) == measured
