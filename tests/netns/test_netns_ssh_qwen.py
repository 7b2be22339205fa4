"""The packaged Qwen2.5-Coder-1.5B (1.12 GB) served over SSH by two namespace hosts that each hold less than the model.

Each host's memory budget (the hosts file's `mem_mb` and its namespace's memory cgroup, which its sshd and so
every stage it starts run in) is 900 MiB, below the model's 1,065 MiB of weights, so the plan must split it. The
hosts' link carries a 20 ms delay (netem where this kernel has it, else the userspace link emulator,
skippy.netns.wire: sending the two slices through it took ~10 s here). A short greedy completion, served
by the two SSH stages, equals the unsplit model's bitwise, and each stage process maps its own slice, never the
whole GGUF. Kept light for CI: one lane of 256 tokens, a short prompt, 16 tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from netns_helpers import MakeHosts
from sshd_helpers import sshd_hosts, stage_processes, wait_empty

from skippy.netns import LinkConditions
from skippy.netns.cgroups import cgroup_dir, memory_unavailable_reason

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openai"))
import up_helpers  # noqa: E402  (tests/openai is not a package)
from up_helpers import SkippyServer, launch_up  # noqa: E402

BUDGET_MB = 900  # per host, below the model's weights: neither host can hold it whole
SHAPE = ["--lane-count", "1", "--ctx-size", "256", "--no-prefix-cache"]
PROMPT = {"prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
COLD_READY_S = 600.0  # the first start slices the model and sends each host ~600 MB over SSH on a shared machine


def complete(server: SkippyServer) -> str:
    reply = server.request("POST", "/v1/completions", {"model": server.model_id, **PROMPT}, timeout=300)
    assert reply.status == 200, reply.body
    return str(reply.json()["choices"][0]["text"])


def fresh(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.timeout(900)  # ~4 min on 2 idle CPUs: the planner calibrates this machine, then ~1.5 GB is sent over SSH
def test_qwen_1_5b_split_over_two_ssh_hosts_below_its_size_equals_the_unsplit_model(
        netns_hosts: MakeHosts, qwen15b_path: Path, tmp_path: Path, skippy_cache_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if (reason := memory_unavailable_reason()) is not None:
        pytest.skip(f"hosts cannot get a memory budget: {reason}")
    model_mib = qwen15b_path.stat().st_size / 2**20
    assert BUDGET_MB < model_mib
    monkeypatch.setattr(up_helpers, "READY_TIMEOUT_S", COLD_READY_S)
    with launch_up(fresh(tmp_path / "whole"), skippy_cache_dir, None,
                   ["--model", str(qwen15b_path), *SHAPE, "--split", "none"]) as whole:
        expected = complete(whole)

    host_set = netns_hosts(2, LinkConditions(delay_ms=20), mem_mb=BUDGET_MB)
    assert all(cgroup_dir(namespace) is not None for namespace, _ in host_set.hosts)
    with sshd_hosts(host_set, tmp_path / "ssh") as hosts:
        hosts_file = tmp_path / "hosts.json"
        hosts_file.write_text(json.dumps({"hosts": [{**h.entry(f"h{i + 1}"), "mem_mb": BUDGET_MB}
                                                    for i, h in enumerate(hosts)]}))
        with launch_up(fresh(tmp_path / "split"), skippy_cache_dir, None,
                       ["--model", str(qwen15b_path), *SHAPE, "--hosts", str(hosts_file)]) as server:
            assert complete(server) == expected
            plan = json.loads((server.run_dir / "topology" / "plan.json").read_text())
            assert [s["host"] for s in plan["stages"]] == ["h1", "h2"], plan["stages"]
            for host, stage in zip(hosts, plan["stages"]):
                [(pid, _)] = stage_processes(host)
                maps = Path(f"/proc/{pid}/maps").read_text()
                [sliced] = list((host.cache_dir / "slices").glob("*.lean.gguf"))  # beside it: the model's skeleton
                assert f"-{stage['layer_start']}-{stage['layer_end']}-" in sliced.name, sliced.name
                assert str(sliced) in maps and str(qwen15b_path) not in maps, (stage, maps[-2000:])
        for host in hosts:
            assert wait_empty(host) == [], host.namespace
