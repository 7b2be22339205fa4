"""Calibration on a tiny model (real llama.cpp in a pinned child), and `skippy plan` / `skippy up` end to end.

The plan's topology must be one `skippy check-config` accepts and `skippy up --topology` serves; `skippy up
--stage-cpus` without `--split` must plan its split (printing the plan) and serve it; a memory budget
below what the model needs is refused naming it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import Any

import pytest

from skippy.bench.plan import add_to, predicted_plan
from skippy.launcher import default_kv_cache, read_events, write_local_topology
from skippy.plan import calibrate
from skippy.plan.calibrate import calibrated_costs, cost_cache_path
from skippy.plan.costs import ROWS
from skippy.plan.hosts import hosts_from_flags
from skippy.remote.shipping import data_ranges
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.slices import ensure_skeleton, ensure_slice, file_digest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openai"))
from up_helpers import launch_up  # noqa: E402  (tests/openai is not a package)

CPUS = sorted(os.sched_getaffinity(0))
STAGE_CPUS = f"{CPUS[0]},{CPUS[-1]}"  # two hosts: one CPU each (the same one on a 1-CPU machine)


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("llama", n_layer=6)


def skippy(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SKIPPY_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "skippy.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=240)


def test_calibration_measures_every_part_once_per_cpu_set(model: Path, skippy_cache_dir: Path) -> None:
    costs = calibrated_costs(model, str(CPUS[0]))
    path = cost_cache_path(model, str(CPUS[0]))
    assert path.is_file() and costs.cpus == str(CPUS[0]) and costs.rows == ROWS
    assert costs.n_layer == 6 and all(len(v) == len(ROWS) for v in (*costs.layer_ms, costs.embed_ms, costs.head_ms))
    assert all(math.isfinite(ms) and ms >= 0 for ms in (*chain(*costs.layer_ms), *costs.embed_ms, *costs.head_ms))
    assert len(set(costs.layer_ms)) == 1  # one per-layer cost measured, shared out by bytes: these layers are alike
    for rows in ROWS:  # the whole model's decode is some real time, and its parts add up to it wherever it is cut
        whole = costs.stage_ms(0, 6, rows)
        assert math.isfinite(whole) and whole > 0
        assert whole == pytest.approx(costs.stage_ms(0, 3, rows) + costs.stage_ms(3, 6, rows))
    stamp = path.stat().st_mtime_ns
    assert calibrated_costs(model, str(CPUS[0])) == costs and path.stat().st_mtime_ns == stamp  # cached
    assert cost_cache_path(model, "all") != path


def test_a_table_measured_on_another_machine_is_not_used(model: Path, skippy_cache_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    here = cost_cache_path(model, str(CPUS[0]))
    monkeypatch.setattr(calibrate, "machine_fingerprint", lambda: "another-machine")
    assert cost_cache_path(model, str(CPUS[0])) != here


def test_plan_writes_a_topology_that_check_config_accepts(model: Path, skippy_cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    done = skippy("plan", "--model", str(model), "--stage-cpus", STAGE_CPUS, "--lane-count", "2", "--ctx-size", "128",
                  "--stages", "2", "--plan-for", "decode", "--out", str(out), cache=skippy_cache_dir)
    assert done.returncode == 0, done.stderr
    assert "plan, chosen for the most tok/s at 2 stream(s): 2 stage(s)" in done.stdout
    assert "c=16: TPOT ms, tok/s" in done.stdout and "split into 2" in done.stdout
    summary = json.loads((out / "plan.json").read_text())
    assert [s["layer_start"] for s in summary["stages"]] == [0, summary["stages"][0]["layer_end"]]
    assert summary["stages"][-1]["layer_end"] == 6 and summary["stage_cpus"] == STAGE_CPUS
    for config in ("stage0.json", "stage1.json"):
        check = skippy("check-config", "--config", str(out / config), "--topology", str(out / "topology.json"),
                       cache=skippy_cache_dir)
        assert check.returncode == 0, check.stderr


def test_plan_for_a_prompt_says_so_and_predicts_its_prefill(model: Path, skippy_cache_dir: Path) -> None:
    shape = ["--model", str(model), "--stage-cpus", STAGE_CPUS, "--no-replicas", "--lane-count", "2", "--ctx-size", "128"]
    done = skippy("plan", *shape, "--plan-for", "prefill", "--plan-prompt-tokens", "2048", cache=skippy_cache_dir)
    assert done.returncode == 0, done.stderr
    assert "plan, chosen for the shortest prefill of a 2048-token prompt: " in done.stdout
    assert "predicted prefill of a 2048-token prompt: this plan " in done.stdout
    decode = skippy("plan", *shape, "--plan-for", "decode", cache=skippy_cache_dir)
    assert "plan, chosen for the most tok/s at 2 stream(s): " in decode.stdout and "predicted prefill" not in decode.stdout
    agent = skippy("plan", *shape, cache=skippy_cache_dir)  # the default: an agent's long prompt and short answer
    assert "plan, chosen for an agent's request: a 8192-token prompt's prefill + 256 tokens at 2 stream(s): " in agent.stdout


def test_a_budget_below_the_model_is_refused_naming_it(model: Path, skippy_cache_dir: Path) -> None:
    done = skippy("plan", "--model", str(model), "--stage-cpus", STAGE_CPUS, "--host-mem-mb", "20", cache=skippy_cache_dir)
    assert done.returncode == 2
    assert "does not fit any split of these hosts" in done.stderr and "20 MiB" in done.stderr


def test_up_with_stage_cpus_and_no_split_serves_the_plan(model: Path, skippy_cache_dir: Path, tmp_path: Path) -> None:
    with launch_up(tmp_path, skippy_cache_dir, None, ["--model", str(model), "--stage-cpus", STAGE_CPUS, "--no-replicas",
                                                      "--lane-count", "2", "--ctx-size", "128"]) as server:
        reply = server.request("POST", "/v1/completions", {"model": server.model_id, "prompt": "hello", "max_tokens": 4,
                                                           "ignore_eos": True})
        assert reply.status == 200, reply.body
        assert reply.json()["usage"]["completion_tokens"] == 4
    err = (tmp_path / "up.stderr").read_text()
    assert "plan, chosen for an agent's request: a 8192-token prompt's prefill + 256 tokens at 2 stream(s): 2 stage(s)" in err
    assert "one host (no --split" not in err  # hosts were given: no one-host note
    topology = json.loads((tmp_path / "run" / "topology" / "topology.json").read_text())
    assert len(topology["stages"]) == 2 and topology["topology_id"] == "plan"


def test_bench_plan_calibrates_again_unless_told_to_use_the_cached_tables(model: Path, skippy_cache_dir: Path) -> None:
    parser = argparse.ArgumentParser()
    add_to(parser.add_subparsers())
    path = cost_cache_path(model, str(CPUS[0]))
    hosts = hosts_from_flags(str(CPUS[0]))

    def stamp_after(*flags: str) -> int:
        predicted_plan(parser.parse_args(["plan", "--stage-cpus", str(CPUS[0]), *flags]), model, hosts, 2, 2)
        return path.stat().st_mtime_ns

    first = stamp_after("--cached-costs")  # measured once if not cached yet
    assert stamp_after("--cached-costs") == first  # the cached table
    assert stamp_after() != first  # measured again, just before the runs


def test_up_serves_replicas_one_pipeline_per_topology_each_pinned(model: Path, skippy_cache_dir: Path,
                                                                   tmp_path: Path) -> None:
    """`skippy up --topology A --topology B --stage-cpus X,Y` (what a replicated plan prints): one whole-model pipeline
    per topology behind the one broker, each pinned to its share of --stage-cpus; concurrent requests use both."""
    topologies = [write_local_topology(tmp_path / f"replica{i}", model, 6, [], lane_count=2, ctx_size=128, model_id="m",
                                       topology_id=f"replica{i}", stage_prefix=f"replica{i}-")[0] for i in range(2)]
    args = [arg for t in topologies for arg in ("--topology", str(t))]
    with launch_up(tmp_path, skippy_cache_dir, None, [*args, "--stage-cpus", STAGE_CPUS]) as server:
        body = {"model": server.model_id, "prompt": "hello", "max_tokens": 24, "ignore_eos": True}
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda _: server.request("POST", "/v1/completions", body, timeout=120), range(4)))
        assert [r.status for r in replies] == [200] * 4, [r.body for r in replies]
        assert [r.json()["usage"]["completion_tokens"] for r in replies] == [24] * 4
    run = tmp_path / "run"
    assert "starting 2 replicas (2 stages)" in (tmp_path / "up.stderr").read_text()
    for i, cpu in enumerate(STAGE_CPUS.split(",")):
        events = read_events(run / f"replica{i}-stage0.log")
        assert [e["cpu_affinity"] for e in events if e["event"] == "loading"] == [cpu]
        assert any(e["event"] == "request_done" for e in events), f"replica{i} served nothing"
    broker = read_events(run / "broker.log")
    assert len({e["pipeline"] for e in broker if e["event"] == "pipeline_ready"}) == 2


def test_up_refuses_stage_cpus_that_do_not_cover_every_replica(model: Path, skippy_cache_dir: Path,
                                                                tmp_path: Path) -> None:
    topologies = [write_local_topology(tmp_path / f"r{i}", model, 6, [], model_id="m", stage_prefix=f"r{i}-")[0]
                  for i in range(2)]
    done = skippy("up", "--topology", str(topologies[0]), "--topology", str(topologies[1]), "--stage-cpus",
                  str(CPUS[0]), "--run-dir", str(tmp_path / "run"), "--bind", "127.0.0.1:0", cache=skippy_cache_dir)
    assert done.returncode != 0
    assert "--stage-cpus must give one CPU set per stage (1 in" in done.stderr and "got 1" in done.stderr


def test_up_refuses_replicas_whose_stage_ids_collide(model: Path, skippy_cache_dir: Path, tmp_path: Path) -> None:
    """Two topologies both naming `stage0` would share one process name, log and restart count: refused first."""
    topologies = [write_local_topology(tmp_path / f"r{i}", model, 6, [], model_id="m")[0] for i in range(2)]
    done = skippy("up", "--topology", str(topologies[0]), "--topology", str(topologies[1]),
                  "--run-dir", str(tmp_path / "run"), "--bind", "127.0.0.1:0", cache=skippy_cache_dir)
    assert done.returncode != 0
    assert f"--topology {topologies[1]}: stage id 'stage0' is also in --topology {topologies[0]}" in done.stderr
    assert not list((tmp_path / "run").glob("*.log"))  # nothing started


@pytest.mark.skipif(len(CPUS) < 2, reason="replicas need two CPUs that no other replica uses")
def test_plan_weighs_replicas_unless_told_not_to(model: Path, skippy_cache_dir: Path) -> None:
    shape = ["--model", str(model), "--stage-cpus", STAGE_CPUS, "--lane-count", "2", "--ctx-size", "128", "--plan-for",
             "decode"]
    assert "2 replicas of 1 stage" in skippy("plan", *shape, cache=skippy_cache_dir).stdout
    split = skippy("plan", *shape, "--no-replicas", cache=skippy_cache_dir)
    assert split.returncode == 0, split.stderr
    assert "replica" not in split.stdout and "plan, chosen for the most tok/s at 2 stream(s): " in split.stdout


@pytest.mark.skipif(len(CPUS) < 2, reason="replicas need two CPUs that no other replica uses")
def test_up_with_stage_cpus_serves_replicas_when_the_plan_says_so(model: Path, skippy_cache_dir: Path,
                                                                   tmp_path: Path) -> None:
    """Every core holds the tiny model: at 2 streams a replica per core beats one core, and no split beats them."""
    with launch_up(tmp_path, skippy_cache_dir, None, ["--model", str(model), "--stage-cpus", STAGE_CPUS,
                                                      "--lane-count", "2", "--ctx-size", "128", "--plan-for",
                                                      "decode"]) as server:
        reply = server.request("POST", "/v1/completions", {"model": server.model_id, "prompt": "hi", "max_tokens": 3,
                                                           "ignore_eos": True})
        assert reply.status == 200, reply.body
    err = (tmp_path / "up.stderr").read_text()
    assert "plan, chosen for the most tok/s at 2 stream(s): 2 replicas of 1 stage" in err
    assert "replicate: the whole model on each of 2 hosts" in err and "starting 2 replicas (2 stages)" in err
    for i, cpu in enumerate(STAGE_CPUS.split(",")):
        topology = json.loads((tmp_path / "run" / "topology" / f"r{i}" / "topology.json").read_text())
        assert [(s["stage_id"], s["layer_start"], s["layer_end"]) for s in topology["stages"]] == [(f"replica{i}-stage0", 0, 6)]
        loading = [e for e in read_events(tmp_path / "run" / f"replica{i}-stage0.log") if e["event"] == "loading"]
        assert [e["cpu_affinity"] for e in loading] == [cpu]


def _served_by(run: Path, request_id: str) -> tuple[int, dict[str, Any]]:
    """(replica index, its request_done line) for an adapter's completion id."""
    rid = request_id.removeprefix("cmpl-")
    for i in range(2):
        for event in read_events(run / f"replica{i}-stage0.log"):
            if event["event"] == "request_done" and event["request_id"] == rid:
                return i, event
    raise AssertionError(f"no replica logged request {rid}")


def test_replicas_route_a_prompt_to_the_replica_that_holds_its_prefix(model: Path, skippy_cache_dir: Path,
                                                                       tmp_path: Path) -> None:
    """Two long prompts served at once land on different replicas; each one's next turn, sent when both are idle
    (least-loaded alone would pick the first replica for both), goes where its prefix is cached and hits it."""
    topologies = [write_local_topology(tmp_path / f"r{i}", model, 6, [], lane_count=2, ctx_size=256, model_id="m",
                                       topology_id=f"r{i}", stage_prefix=f"replica{i}-",
                                       extra={"kv_cache": default_kv_cache(2)})[0] for i in range(2)]
    args = [arg for t in topologies for arg in ("--topology", str(t))]
    prompts = [" ".join(f"{word} {n}" for n in range(12)) for word in ("apple", "river")]
    with launch_up(tmp_path, skippy_cache_dir, None, [*args, "--no-speculative"]) as server:
        def complete(prompt: str, max_tokens: int) -> str:
            reply = server.request("POST", "/v1/completions", {"model": server.model_id, "prompt": prompt,
                                                               "max_tokens": max_tokens, "ignore_eos": True}, timeout=120)
            assert reply.status == 200, reply.body
            return str(reply.json()["id"])

        with ThreadPoolExecutor(2) as pool:
            first = list(pool.map(lambda p: complete(p, 100), prompts))
        second = [complete(p + " and then", 2) for p in reversed(prompts)]  # the second replica's prompt first
    run = tmp_path / "run"
    where = [_served_by(run, rid)[0] for rid in first]
    assert sorted(where) == [0, 1], "both long requests went to one replica"
    for rid, replica in zip(second, reversed(where)):
        served, done = _served_by(run, rid)
        assert served == replica and done["cached_prompt_tokens"] > 0, done


@pytest.mark.parametrize(("flags", "ranges"), [
    ([], [(0, 6)]),  # one host: the model whole, as the plan for one host says
    (["--split", "2"], [(0, 2), (2, 6)]),  # --split wins
    (["--split", "none", "--downstream-wire-delay-ms", "20"], [(0, 6)]),  # one stage, said outright
    (["--downstream-wire-delay-ms", "20"], [(0, 3), (3, 6)]),  # a link flag asks for a link: the layers halved
    (["--", "--downstream-wire-mbps", "100"], [(0, 3), (3, 6)]),  # after -- as well
])
def test_up_without_hosts_serves_one_host_whole_unless_split_or_a_link_is_asked_for(
        model: Path, tmp_path: Path, flags: list[str], ranges: list[tuple[int, int]]) -> None:
    from skippy.cli import up  # noqa: PLC0415
    from skippy.cli.main import build_parser  # noqa: PLC0415
    from skippy.config import StageTopology  # noqa: PLC0415

    argv = ["up", "--model", str(model), *flags]
    cut = argv.index("--") if "--" in argv else len(argv)  # as skippy.cli.main splits them
    args = build_parser().parse_args(argv[:cut])
    args.passthrough = argv[cut + 1:]
    [pipeline] = up._pipelines(args, tmp_path)
    stages = StageTopology.load(pipeline.topology).stages
    assert [(s.layer_start, s.layer_end) for s in stages] == ranges
    note = up._layout_note(args) or ""  # what `skippy up` says once the flags are known good
    assert ("the model whole in one stage" in note) == (not flags)
    assert ("describes a link between stages" in note) == (len(ranges) == 2 and "--split" not in flags)


@pytest.mark.parametrize("split", ["abc", "0", "6", "4,2", "3,3", ","])
def test_up_refuses_a_split_outside_the_model_naming_it(model: Path, skippy_cache_dir: Path, tmp_path: Path,
                                                        split: str) -> None:
    done = skippy("up", "--model", str(model), "--split", split, "--bind", "127.0.0.1:0", "--run-dir",
                  str(tmp_path / "run"), cache=skippy_cache_dir)
    assert done.returncode == 2, done.stderr
    assert f"--split must be rising layer numbers between 1 and 5 separated by commas (the model has 6 layers), or" \
           f" none for one stage; got '{split}'" in done.stderr
    assert not list((tmp_path / "run").glob("*.log")), "nothing may start"


def test_a_skeleton_is_timed_like_its_model_without_its_weights(model: Path, skippy_cache_dir: Path) -> None:
    """What an SSH host without the model is sent to calibrate on: the model's metadata and tensor layout, every
    tensor zeros (holes: only the header is data), and its slices skeletons too; llama.cpp runs it end to end."""
    skeleton = ensure_skeleton(model)
    assert ensure_skeleton(model) == skeleton and 0 <= skeleton.stat().st_size - model.stat().st_size <= 4096
    source, copy = GGUFFile(model), GGUFFile(skeleton)
    try:
        assert [(t.name, t.dims, t.ggml_type) for t in copy.tensors] == [(t.name, t.dims, t.ggml_type) for t in source.tensors]
        assert all(not any(copy.tensor_bytes(t)) for t in copy.tensors)
        assert {k: copy.raw_entry(k) for k in source.kv} == {k: source.raw_entry(k) for k in source.kv}
        assert copy.get("skippy.skeleton") == file_digest(model)
        data_start = copy.data_start
    finally:
        source.close()
        copy.close()
    ranges = data_ranges(skeleton)
    if ranges and ranges[-1][1] > data_start + 4096:
        pytest.skip(f"{skeleton.parent}'s filesystem reports no holes (SEEK_HOLE)")
    piece = ensure_slice(skeleton, 0, 3, final=False)
    sliced = GGUFFile(piece)
    try:
        assert sliced.get("skippy.skeleton") == file_digest(model) and all(not any(sliced.tensor_bytes(t))
                                                                            for t in sliced.tensors)
    finally:
        sliced.close()
    costs = calibrated_costs(skeleton, str(CPUS[0]))
    assert costs.n_layer == 6 and all(math.isfinite(ms) and ms >= 0 for ms in (*chain(*costs.layer_ms), *costs.head_ms))
    assert all(costs.stage_ms(0, 6, rows) > 0 for rows in ROWS)
