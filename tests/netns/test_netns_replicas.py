"""`skippy up --netns PREFIX --stage-cpus X,Y` where every namespace host holds the whole model on a core of its own:
the plan serves a replica per host, each replica's stage runs inside its host (bound at the host's address, its
broker link over the bridge, its /metrics there too, so the dashboard shows it up), and concurrent requests are
served by both.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from netns_helpers import MakeHosts

from skippy.config.serving_args import flag_owner
from skippy.launcher import read_events

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openai"))
from up_helpers import launch_up  # noqa: E402  (tests/openai is not a package)

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(CPUS) < 2, reason="replicas need two CPUs that no other replica uses")
def test_netns_hosts_each_holding_the_model_serve_a_replica_each(netns_hosts: MakeHosts,
                                                                 tiny_model: Callable[..., Path], tmp_path: Path,
                                                                 skippy_cache_dir: Path) -> None:
    hosts = netns_hosts(2, emulator="none")
    model = tiny_model("llama", n_layer=6)
    cpus = f"{CPUS[0]},{CPUS[-1]}"
    insecure = ["--insecure-links"] if flag_owner("--insecure-links") is not None else []
    with launch_up(tmp_path, skippy_cache_dir, None, ["--model", str(model), "--netns", hosts.prefix, "--stage-cpus",
                                                      cpus, "--lane-count", "2", "--ctx-size", "128",
                                                      "--plan-for", "decode", *insecure]) as server:
        body = {"model": server.model_id, "prompt": "hello", "max_tokens": 24, "ignore_eos": True}
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda _: server.request("POST", "/v1/completions", body, timeout=120), range(4)))
        assert [r.status for r in replies] == [200] * 4, [r.body for r in replies]
        assert [r.json()["usage"]["completion_tokens"] for r in replies] == [24] * 4
        for i, (namespace, _address) in enumerate(hosts.hosts):
            (pid,) = server.stage_pids(f"r{i}/replica{i}-stage0")
            assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{namespace}").st_ino, namespace
        processes = server.request("GET", "/dashboard/data").json()["processes"]
        # each stage's /metrics at its host's address (inside a namespace, 127.0.0.1 is the namespace's own)
        assert all(p["up"] for p in processes), processes
        assert {p["url"].split("/")[2].rsplit(":", 1)[0] for p in processes if "stage" in p["process"]} == \
            {address for _, address in hosts.hosts}, processes
    err = (tmp_path / "up.stderr").read_text()
    assert "2 replicas of 1 stage" in err and "starting 2 replicas (2 stages)" in err, err
    for i, (_namespace, address) in enumerate(hosts.hosts):
        events = list(read_events(tmp_path / "run" / f"replica{i}-stage0.log"))
        ready = [e for e in events if e["event"] == "ready"]
        assert [e["endpoint"].rsplit(":", 1)[0] for e in ready] == [f"tcp://{address}"], ready
        assert [e["cpu_affinity"] for e in events if e["event"] == "loading"] == [cpus.split(",")[i]]
        assert any(e["event"] == "request_done" for e in events), f"replica{i} on {address} served nothing"
