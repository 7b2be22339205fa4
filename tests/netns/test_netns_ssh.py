"""`skippy up --hosts FILE` with SSH hosts: two namespace hosts reached only over SSH, each sent only its layers.

Each namespace host runs Debian's OpenSSH server (sshd_helpers; keys made here, a known_hosts file naming each
host's key) and has a cache directory of its own. `skippy up --hosts` plans SmolLM2-135M over the two (150 MiB
each: the whole model needs ~205 MiB, so it must split), sends each host its stage's slice into that cache, starts
the stages there over SSH and serves a greedy chat completion equal to the unsplit model's. Each stage process
runs inside its host and maps its slice, never the whole GGUF; each host's cache holds its slice only, smaller
than the model; the stages' JSON logs come back into the run directory (`skippy logs` merges them). SIGINT to
`skippy up` leaves no process on either host. Started again, nothing is sent (the slices are in the caches). A
remote stage SIGKILLed is restarted on its host (its host asked again first) and serves on.
A host whose key is not in known_hosts is refused in one line, and so is a host whose Python has no skippy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from netns_helpers import MakeHosts
from sshd_helpers import GONE_TIMEOUT_S, SshHost, sshd_hosts, stage_processes, wait_empty

from skippy.runtime.models import resolve_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openai"))
from up_helpers import SkippyServer, launch_up  # noqa: E402  (tests/openai is not a package)

SHAPE = ["--model", "smollm2-135m", "--lane-count", "2", "--ctx-size", "256"]
BUDGET_MB = 150  # per host: below the whole model's need at this shape (~205 MiB), so the plan splits
CHAT = {"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 24, "temperature": 0}


def write_hosts(path: Path, hosts: list[SshHost], **ssh: Any) -> Path:
    path.write_text(json.dumps({"hosts": [{**h.entry(f"h{i + 1}", **ssh), "mem_mb": BUDGET_MB}
                                          for i, h in enumerate(hosts)]}))
    return path


def chat(server: SkippyServer) -> str:
    reply = server.request("POST", "/v1/chat/completions", {"model": server.model_id, **CHAT}, timeout=120)
    assert reply.status == 200, reply.body
    return str(reply.json()["choices"][0]["message"]["content"])


def fresh(path: Path) -> Path:
    path.mkdir()
    return path


def up_fails(args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skippy.cli.main", "up", "--bind", "127.0.0.1:0", *args],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "SKIPPY_CACHE_DIR": str(cache)})


def test_up_over_ssh_ships_each_host_its_slice_and_serves_the_unsplit_text(
        netns_hosts: MakeHosts, tmp_path: Path, skippy_cache_dir: Path) -> None:
    model = resolve_model_path("smollm2-135m")
    with launch_up(fresh(tmp_path / "whole"), skippy_cache_dir, None, [*SHAPE, "--split", "none"]) as whole:
        expected = chat(whole)
    ssh_hosts_set = netns_hosts(2, emulator="none")
    with sshd_hosts(ssh_hosts_set, tmp_path / "ssh") as hosts:
        hosts_file = write_hosts(tmp_path / "hosts.json", hosts)
        with launch_up(fresh(tmp_path / "first"), skippy_cache_dir, None, [*SHAPE, "--hosts", str(hosts_file)]) as server:
            assert chat(server) == expected
            plan = json.loads((server.run_dir / "topology" / "plan.json").read_text())
            assert [s["host"] for s in plan["stages"]] == ["h1", "h2"], plan["stages"]
            for host, stage in zip(hosts, plan["stages"]):
                slices = list((host.cache_dir / "slices").glob("*.lean.gguf"))  # beside it: the model's skeleton
                assert len(slices) == 1 and slices[0].stat().st_size < model.stat().st_size, slices
                assert f"-{stage['layer_start']}-{stage['layer_end']}-" in slices[0].name, slices[0].name
                [(pid, _)] = stage_processes(host)
                maps = Path(f"/proc/{pid}/maps").read_text()
                assert str(slices[0]) in maps and str(model) not in maps
                log = server.run_dir / f"{stage['stage_id']}.log"
                events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
                assert any(e.get("event") == "ready" and e.get("stage_id") == stage["stage_id"] for e in events), log
            merged = subprocess.run([sys.executable, "-m", "skippy.cli.main", "logs", str(server.run_dir), "--json"],
                                    capture_output=True, text=True, timeout=60)
            assert {"stage0", "stage1"} <= {json.loads(line).get("stage_id") for line in merged.stdout.splitlines()}
            first_slices = {h.namespace: [(p.name, p.stat().st_mtime_ns) for p in (h.cache_dir / "slices").glob("*")]
                            for h in hosts}
        stderr = (tmp_path / "first" / "up.stderr").read_text()
        assert stderr.count("sent stage") == 2, stderr
        for host in hosts:  # SIGINT reached every remote stage: nothing left on either host
            assert wait_empty(host) == [], host.namespace

        with launch_up(fresh(tmp_path / "again"), skippy_cache_dir, None, [*SHAPE, "--hosts", str(hosts_file)]) as server:
            assert chat(server) == expected
        stderr = (tmp_path / "again" / "up.stderr").read_text()
        assert "sent stage" not in stderr and stderr.count("in its cache: nothing sent") == 2, stderr
        assert {h.namespace: [(p.name, p.stat().st_mtime_ns) for p in (h.cache_dir / "slices").glob("*")]
                for h in hosts} == first_slices
        for host in hosts:
            assert wait_empty(host) == [], host.namespace


def test_a_remote_stage_killed_is_restarted_on_its_host(netns_hosts: MakeHosts, tmp_path: Path,
                                                        skippy_cache_dir: Path) -> None:
    with sshd_hosts(netns_hosts(2, emulator="none"), tmp_path / "ssh") as hosts:
        hosts_file = write_hosts(tmp_path / "hosts.json", hosts)
        with launch_up(fresh(tmp_path / "up"), skippy_cache_dir, None, [*SHAPE, "--hosts", str(hosts_file)]) as server:
            before = chat(server)
            [(pid, _)] = stage_processes(hosts[1])
            os.kill(pid, signal.SIGKILL)
            assert chat(server) == before  # stage 0 waits for it, then serves
            [(again, _)] = stage_processes(hosts[1])
            assert again != pid
            deadline = time.monotonic() + GONE_TIMEOUT_S  # its record is written just after it said ready
            while (record := json.loads((server.run_dir / "restarts.json").read_text())["stage1"])["restarts"] == 0 \
                    and time.monotonic() < deadline:
                time.sleep(0.05)  # poll interval of a bounded wait
            assert record["restarts"] == 1 and record["exit_codes"] == [128 + signal.SIGKILL], record
        stderr = (tmp_path / "up" / "up.stderr").read_text()
        assert "h2 has stage1's slice (layers" in stderr, stderr  # asked again before the restart, nothing sent
        for host in hosts:
            assert wait_empty(host) == [], host.namespace


def test_an_unknown_host_key_or_a_missing_skippy_is_one_line(
        netns_hosts: MakeHosts, tmp_path: Path, skippy_cache_dir: Path) -> None:
    with sshd_hosts(netns_hosts(2, emulator="none"), tmp_path / "ssh") as hosts:
        unknown = tmp_path / "empty_known_hosts"
        unknown.write_text("")
        refused = up_fails([*SHAPE, "--run-dir", str(tmp_path / "r1"),
                            "--hosts", str(write_hosts(tmp_path / "h1.json", hosts, known_hosts_file=str(unknown)))],
                           skippy_cache_dir)
        assert refused.returncode == 2
        last = refused.stderr.strip().splitlines()[-1]
        assert "host key" in last and "StrictHostKeyChecking=yes" in last and "host h" in last, refused.stderr
        assert not list(hosts[0].cache_dir.glob("**/*.gguf")), "nothing is sent to a host whose key is unknown"

        missing = up_fails([*SHAPE, "--run-dir", str(tmp_path / "r2"),
                            "--hosts", str(write_hosts(tmp_path / "h2.json", hosts, python="/usr/bin/python3"))],
                           skippy_cache_dir)
        assert missing.returncode == 2
        last = missing.stderr.strip().splitlines()[-1]
        assert "has no skippy" in last and "/usr/bin/python3" in last, missing.stderr
        for host in hosts:
            assert wait_empty(host) == [], host.namespace
