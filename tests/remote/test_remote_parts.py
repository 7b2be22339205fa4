"""The parts of SSH hosts that run without sshd or root: the hosts file's `ssh` entries, the OpenSSH command line
and its failures in one line, a slice received whole or not at all, and a stage run through the relay and the
host agent (the agent in place of `ssh ... host_agent launch`), which sends only the stage's own secret key, logs
into the run directory and stops the stage when its session ends or its relay dies.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skippy.config import ConfigError
from skippy.launcher import StageProcesses, write_local_topology
from skippy.plan.hosts import load_hosts
from skippy.remote.relay import header
from skippy.remote.shipping import data_ranges
from skippy.remote.ssh import SSH_FAILED, failure, ssh_argv
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.slices import read_model_info, write_slice
from skippy.transport.curve_keys import add_link_keys

STOP_TIMEOUT_S = 30.0


def hosts_file(tmp_path: Path, entries: list[dict[str, object]]) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"hosts": entries}))
    return path


def test_a_hosts_file_names_ssh_hosts_and_refuses_bad_entries_by_field(tmp_path: Path) -> None:
    [a, b] = load_hosts(hosts_file(tmp_path, [
        {"name": "a", "ssh": "me@10.0.0.5", "mem_mb": 300},
        {"name": "b", "address": "10.0.1.7", "ssh": {"destination": "box", "port": 2222, "identity_file": "~/.ssh/k",
                                                     "python": "/opt/sk/bin/python", "model_path": "/m/q.gguf"}}]))
    assert a.address == "10.0.0.5" and a.ssh is not None and a.ssh.python == "python3"
    assert b.address == "10.0.1.7" and b.ssh is not None and (b.ssh.port, b.ssh.model_path) == (2222, "/m/q.gguf")
    assert "ssh me@10.0.0.5" in a.describe()
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"ssh": {"destination": "x", "user": "me"}}, r"hosts\[0\]\.ssh\.user is not an ssh field"),
        ({"ssh": {"destination": "x", "port": 0}}, r"hosts\[0\]\.ssh\.port must be a port number"),
        ({"ssh": "-oProxyCommand=x"}, r"hosts\[0\]\.ssh\.destination must be"),
        ({"ssh": {"port": 22}}, r"hosts\[0\]\.ssh\.destination is missing"),
        ({"ssh": 7}, r"hosts\[0\]\.ssh must be")]
    for entry, field in refusals:
        with pytest.raises(ConfigError, match=field):
            load_hosts(hosts_file(tmp_path, [{"name": "a", **entry}]))
    with pytest.raises(ConfigError, match="loopback"):  # an SSH host's stage must reach every other stage
        load_hosts(hosts_file(tmp_path, [{"name": "here"}, {"name": "b", "ssh": "me@10.0.0.5"}]))


def test_ssh_runs_in_batch_mode_refusing_unknown_host_keys(tmp_path: Path) -> None:
    [host] = load_hosts(hosts_file(tmp_path, [{"name": "a", "ssh": {
        "destination": "me@10.0.0.5", "port": 2200, "identity_file": "/k/id", "known_hosts_file": "/k/known"}}]))
    assert host.ssh is not None
    argv = ssh_argv(host.ssh, "python3 -V")
    options = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "-o"]
    assert {"BatchMode=yes", "StrictHostKeyChecking=yes", "UserKnownHostsFile=/k/known", "IdentitiesOnly=yes"} <= set(options)
    assert argv[-3:] == ["--", "me@10.0.0.5", "python3 -V"] and argv[argv.index("-p") + 1] == "2200"
    key = failure("host a", host.ssh, SSH_FAILED, "No ED25519 host key is known for [10.0.0.5]:2200 and you have "
                  "requested strict checking.\r\nHost key verification failed.\r\n")
    assert key.startswith("host a: SSH refused its host key") and "/k/known" in key and "\n" not in key
    login = failure("host a", host.ssh, SSH_FAILED, "me@10.0.0.5: Permission denied (publickey).")
    assert "login refused" in login and "identity_file" in login
    assert "set ssh.python" in failure("host a", host.ssh, 127, "bash: python3: command not found")


def receive(path: Path, data: bytes, sha256: str, size: int, *flags: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "skippy.remote.host_agent", "receive", str(path), sha256, str(size),
                           *flags], input=data, capture_output=True, timeout=60)


def test_a_slice_is_kept_only_when_it_arrives_whole(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    good = hashlib.sha256(data).hexdigest()
    dest = tmp_path / "cache" / "slices" / "abc-0-4-stop.gguf"
    cut = receive(dest, data[:-1], good, len(data))
    assert cut.returncode == 1 and b"not kept" in cut.stderr and not dest.exists()
    assert list(dest.parent.iterdir()) == []  # no partial file left
    assert receive(dest, data, good, len(data)).returncode == 0 and dest.read_bytes() == data


def test_a_sparse_slice_travels_as_its_data_ranges_and_arrives_equal(tiny_model: Callable[..., Path],
                                                                     tmp_path: Path) -> None:
    """The unused tensors of a slice are holes: only the ranges between them are sent, the receiver leaves holes
    again, and the file it keeps has the sha256 of the whole one."""
    model = tiny_model("llama")
    path = write_slice(model, tmp_path / "s.gguf", 2, 4, final=False)  # neither the embedding nor the head is read
    zeroed = str(GGUFFile(path).get("skippy.slice.zeroed")).split(",")
    assert zeroed == ["output.weight", "token_embd.weight"] or zeroed == ["token_embd.weight"], zeroed
    ranges = data_ranges(path)
    whole = path.read_bytes()
    sent = b"".join(whole[a:b] for a, b in ranges)
    if sum(b - a for a, b in ranges) == len(whole):
        pytest.skip(f"{tmp_path}'s filesystem reports no holes (SEEK_HOLE)")
    digest, flags = hashlib.sha256(whole).hexdigest(), ("--data", ",".join(f"{a}:{b}" for a, b in ranges))
    dest = tmp_path / "cache" / "slices" / path.name
    assert receive(dest, sent[:-1], digest, len(whole), *flags).returncode == 1 and not dest.exists()
    assert receive(dest, sent + b"x", digest, len(whole), *flags).returncode == 1 and not dest.exists()
    done = receive(dest, sent, digest, len(whole), *flags)
    assert done.returncode == 0, done.stderr
    assert dest.read_bytes() == whole and data_ranges(dest) == ranges


def test_the_relay_sends_only_its_stages_secret_key_and_the_forwarded_environment(tmp_path: Path) -> None:
    topology, configs = write_local_topology(tmp_path / "t", tmp_path / "m.gguf", 8, [4])
    add_link_keys(topology, tmp_path / "t" / "keys", ["client"])
    spec = {"cache_dir": "/srv/cache", "config": {"model_path": "/srv/cache/slices/x.gguf", "load_mode": "artifact-slice"}}
    args = ["stage", "--config", str(configs[1]), "--topology", str(topology), "--metrics-bind", "10.0.0.2"]
    sent = json.loads(header(spec, args, {"SKIPPY_OPENAI_API_KEY": "k", "SKIPPY_CACHE_DIR": "/here", "HOME": "/root",
                                          "GOMP_SPINCOUNT": "1000"}))
    assert sorted(sent["files"]) == ["keys/stage1.key_secret", "stage.json", "topology.json"]
    assert sent["files"]["keys/stage1.key_secret"]["mode"] == 0o600
    assert sent["files"]["keys/stage1.key_secret"]["text"] == (tmp_path / "t" / "keys" / "stage1.key_secret").read_text()
    config = json.loads(sent["files"]["stage.json"]["text"])
    assert (config["model_path"], config["load_mode"]) == ("/srv/cache/slices/x.gguf", "artifact-slice")
    remote_topology = json.loads(sent["files"]["topology.json"]["text"])
    assert remote_topology["keys_dir"] == "keys" and remote_topology["stages"][1]["load_mode"] == "artifact-slice"
    assert sent["args"] == ["stage", "--config", "stage.json", "--topology", "topology.json", "--metrics-bind", "10.0.0.2"]
    assert sent["env"] == {"SKIPPY_OPENAI_API_KEY": "k", "GOMP_SPINCOUNT": "1000", "SKIPPY_CACHE_DIR": "/srv/cache"}


def agent_processes(directory: Path) -> list[str]:
    """Processes naming `directory` on their command line (the agent) or working in it (the stage)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if entry.name.isdigit() and (str(directory) in cmdline or os.readlink(entry / "cwd").startswith(str(directory))):
                found.append(f"{entry.name} {cmdline}")
        except OSError:
            continue
    return found


def test_a_stage_runs_through_relay_and_agent_and_stops_with_its_session(
        tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    model = tiny_model("llama")
    topology, configs = write_local_topology(tmp_path / "t", model, read_model_info(model).n_layer, [3], lane_count=2,
                                             ctx_size=128, extra={"n_threads": 1})
    add_link_keys(topology, tmp_path / "t" / "keys", ["client"])
    remote = tmp_path / "host" / "runs" / "r" / "stage1"
    spec = tmp_path / "stage1.json"  # the host agent in place of `ssh ... host_agent launch DIR`
    spec.write_text(json.dumps({"ssh": [sys.executable, "-m", "skippy.remote.host_agent", "launch", str(remote)],
                                "cache_dir": str(tmp_path / "host"), "config": {}}))

    def prefix(stage_id: str) -> list[str]:
        return [sys.executable, "-m", "skippy.remote.relay", str(spec), "--"] if stage_id == "stage1" else []

    stages = StageProcesses(topology, configs, tmp_path / "run", include_stage0=True, remote_prefix=prefix)
    with stages:
        key = remote / "keys" / "stage1.key_secret"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and sorted(p.name for p in key.parent.iterdir()) == [key.name]
        assert stages.ready["stage1"]["layer_start"] == 3  # its ready line came back through the relay
        events = [json.loads(line) for line in stages.log_path("stage1").read_text().splitlines() if line.startswith("{")]
        assert any(e.get("event") == "ready" and e.get("stage_id") == "stage1" for e in events)
        assert agent_processes(remote)
        stages.procs["stage1"].send_signal(signal.SIGKILL)  # the relay dies: its session's end stops the stage
        assert stages.procs["stage1"].wait(30) == -signal.SIGKILL
        [(name, _)] = stages.dead()
        assert name == "stage1"
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while (left := agent_processes(remote)) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll interval of a bounded wait: the agent stops the stage, then exits
    assert left == [] and not remote.exists()  # the stage and its agent gone, its directory (and key) removed
