"""`skippy keys`: key pairs by name, or for every stage and client of a topology (written into it);
existing pairs are kept unless --force; secret key files are 0600. (The tools that use the client pair
against a keyed pipeline: tests/auth/test_keyed_tools.py.)"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from skippy.config import StageTopology
from skippy.launcher import write_local_topology
from skippy.transport.curve_keys import load_key_pair


def skippy(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skippy.cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_keys_by_name(tmp_path: Path) -> None:
    out = skippy("keys", "--dir", str(tmp_path / "k"), "alpha", "beta")
    assert out.returncode == 0, out.stderr
    printed = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert set(printed) == {"alpha", "beta"}
    for name, public in printed.items():
        assert load_key_pair(tmp_path / "k" / f"{name}.key_secret")[0].decode() == public
        assert stat.S_IMODE((tmp_path / "k" / f"{name}.key_secret").stat().st_mode) == 0o600
        assert (tmp_path / "k" / f"{name}.key").exists()


def test_keys_for_a_topology_are_written_into_it(tmp_path: Path) -> None:
    topology, _ = write_local_topology(tmp_path / "t", tmp_path / "model.gguf", 6, [3])
    out = skippy("keys", "--topology", str(topology), "--client", "broker", "--client", "ops")
    assert out.returncode == 0, out.stderr
    loaded = StageTopology.load(topology)
    assert loaded.keys_dir == "keys"
    assert [c.name for c in loaded.clients] == ["broker", "ops"]
    for stage in loaded.stages:
        assert load_key_pair(tmp_path / "t" / "keys" / f"{stage.stage_id}.key_secret")[0].decode() == stage.public_key
    again = skippy("keys", "--topology", str(topology))  # pairs kept: the same keys (clients now the default)
    assert again.returncode == 0, again.stderr
    assert [s.public_key for s in StageTopology.load(topology).stages] == [s.public_key for s in loaded.stages]
    forced = skippy("keys", "--topology", str(topology), "--force")
    assert forced.returncode == 0, forced.stderr
    assert StageTopology.load(topology).stages[0].public_key != loaded.stages[0].public_key


def test_keys_usage_errors(tmp_path: Path) -> None:
    out = skippy("keys", "alpha")
    assert out.returncode == 2 and "give --dir DIR and names, or --topology T" in out.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"topology_id": "t"}))
    out = skippy("keys", "--topology", str(bad))
    assert out.returncode == 2 and "bad.json" in out.stderr and not (tmp_path / "keys").exists()
