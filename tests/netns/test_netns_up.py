"""`skippy up --topology T` with T's stages on namespace hosts: each stage runs inside its host.

A tiny model split over 3 hosts (5 ms per hop through the link emulator or netem), served over
HTTP by `skippy up` from this namespace (broker and adapter stay here and reach stage 0 over the
bridge). Every stage process must be in the namespace that owns its address, have the stage flags
`skippy up` was given (`--activation-wire-dtype q8` here), and the API must answer end to end.
The `skippy up` helpers are the OpenAI tests' (tests/openai/up_helpers.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from netns_helpers import MakeHosts

from skippy.config.serving_args import flag_owner
from skippy.launcher import write_local_topology
from skippy.netns import LinkConditions
from skippy.netns.topology import place_on_hosts
from skippy.runtime.slices import read_model_info

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openai"))
from up_helpers import launch_up  # noqa: E402  (tests/openai is not a package)


def stage_pid(config: Path) -> int:
    out = subprocess.run(["pgrep", "-f", "--", f"--config {config}"], capture_output=True, text=True).stdout.split()
    assert len(out) == 1, f"expected one process for {config}, got {out}"
    return int(out[0])


def test_skippy_up_runs_each_stage_in_its_host(netns_hosts: MakeHosts, tiny_model: Callable[..., Path],
                                               tmp_path_factory: pytest.TempPathFactory, skippy_cache_dir: Path) -> None:
    hosts = netns_hosts(3, LinkConditions(delay_ms=5.0))
    model = tiny_model("llama")
    root = tmp_path_factory.mktemp("nsup")
    topology, configs = write_local_topology(root / "topology", model, read_model_info(model).n_layer, [2, 4],
                                             lane_count=2, ctx_size=128, model_id="tiny", extra={"n_threads": 1})
    place_on_hosts(topology, configs, [address for _, address in hosts.hosts])
    # issue 11 item 2: non-loopback stage links want keys or an explicit --insecure-links, once that flag exists
    insecure = ["--insecure-links"] if flag_owner("--insecure-links") is not None else []
    with launch_up(root, skippy_cache_dir, None, ["--topology", str(topology), "--activation-wire-dtype", "q8",
                                                  *insecure]) as server:
        reply = server.request("POST", "/v1/completions", {"model": "tiny", "prompt": "hello there", "max_tokens": 8,
                                                                    "ignore_eos": True})
        assert reply.status == 200, reply.body
        assert reply.json()["usage"]["completion_tokens"] == 8
        for config, (namespace, _) in zip(configs, hosts.hosts):
            pid = stage_pid(config)
            assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{namespace}").st_ino, namespace
            assert "--activation-wire-dtype\0q8" in Path(f"/proc/{pid}/cmdline").read_text()
