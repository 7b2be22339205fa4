"""`skippy up` / `skippy plan`: a flag the chosen layout would not read is refused through the real entry point,
one line naming it and why, before anything starts (no run directory, no model read, no calibration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.bench.plan import without_plan_flags
from skippy.cli import plan as plan_cli
from skippy.cli.main import build_parser, main
from skippy.cli.unused_flags import refuse_unused_plan_flags, refuse_unused_up_flags

TOPOLOGY = "with --topology (its stage configs fix {}); drop one"
NOT_PLANNED_TOPOLOGY = "with --topology (nothing is planned: the topology is served as it is); drop one"
NOT_PLANNED_SPLIT = "with --split (nothing is planned: --split fixes the layout); drop one"
NO_HOSTS = ("without hosts to plan for (--stage-cpus, --hosts or --netns): one host serves the model whole,"
            " nothing is planned")
HOSTS_FILE = "with --hosts (the hosts file gives each host's memory and links); drop one"
NETNS = "with --netns (the namespace host set gives each host's memory and links); drop one"
ONE_HOST = "with one host: one stage has no link (--stage-cpus with two CPU sets or more makes a host of each)"
DECODE = "with --plan-for decode (decode rounds have no prompt)"

UP_REFUSED = {
    "topology-split": (["--topology", "t.json", "--split", "3"], "--split", TOPOLOGY.format("the split")),
    "topology-model": (["--topology", "t.json", "--model", "m.gguf"], "--model", TOPOLOGY.format("the model")),
    # the default's own value, given: still a flag that does nothing
    "topology-lanes": (["--topology", "t.json", "--lane-count", "4"], "--lane-count", TOPOLOGY.format("the lanes")),
    "topology-ctx": (["--topology", "t.json", "--ctx-size", "256"], "--ctx-size", TOPOLOGY.format("the context")),
    "topology-kv-pool": (["--topology", "t.json", "--kv-pool-cells", "0"], "--kv-pool-cells",
                         TOPOLOGY.format("the KV pool")),
    "topology-no-prefix-cache": (["--topology", "t.json", "--no-prefix-cache"], "--no-prefix-cache",
                                 TOPOLOGY.format("the prefix cache, kv_cache")),
    "topology-hosts": (["--topology", "t.json", "--hosts", "h.json"], "--hosts",
                       TOPOLOGY.format("where each stage runs")),
    "topology-netns": (["--topology", "t.json", "--netns", "sk"], "--netns", TOPOLOGY.format("where each stage runs")),
    **{f"topology{flag}": (["--topology", "t.json", *flag_argv], flag, NOT_PLANNED_TOPOLOGY)
       for flag, flag_argv in (("--host-mem-mb", ["--host-mem-mb", "300"]), ("--link-delay-ms", ["--link-delay-ms", "5"]),
                               ("--link-mbps", ["--link-mbps", "100"]), ("--plan-concurrency", ["--plan-concurrency", "4"]),
                               ("--recalibrate", ["--recalibrate"]), ("--no-replicas", ["--no-replicas"]))},
    "split-hosts": (["--split", "3", "--hosts", "h.json"], "--hosts",
                    "with --split (it names the hosts to plan a split for; --split splits on this machine); drop one"),
    "split-netns": (["--split", "3", "--netns", "sk"], "--netns",
                    "with --split (it names the hosts to plan a split for; --split splits on this machine); drop one"),
    "split-plan-concurrency": (["--split", "3", "--stage-cpus", "0,1", "--plan-concurrency", "8"], "--plan-concurrency",
                               NOT_PLANNED_SPLIT),
    "split-no-replicas": (["--split", "3", "--no-replicas"], "--no-replicas", NOT_PLANNED_SPLIT),
    **{f"no-hosts{flag}": (flag_argv, flag, NO_HOSTS)
       for flag, flag_argv in (("--host-mem-mb", ["--host-mem-mb", "300"]), ("--link-delay-ms", ["--link-delay-ms", "0"]),
                               ("--link-mbps", ["--link-mbps", "100"]), ("--plan-concurrency", ["--plan-concurrency", "4"]),
                               ("--recalibrate", ["--recalibrate"]), ("--no-replicas", ["--no-replicas"]))},
    "hosts-file-link-delay": (["--hosts", "h.json", "--link-delay-ms", "5"], "--link-delay-ms", HOSTS_FILE),
    "hosts-file-link-mbps": (["--hosts", "h.json", "--link-mbps", "100"], "--link-mbps", HOSTS_FILE),
    "netns-host-mem": (["--netns", "sk", "--host-mem-mb", "300"], "--host-mem-mb", NETNS),
    "netns-link-delay": (["--netns", "sk", "--link-delay-ms", "5"], "--link-delay-ms", NETNS),
    "one-cpu-set-link": (["--stage-cpus", "0", "--link-delay-ms", "5"], "--link-delay-ms", ONE_HOST),
    "split-plan-for": (["--split", "3", "--stage-cpus", "0,1", "--plan-for", "prefill"], "--plan-for", NOT_PLANNED_SPLIT),
    "no-hosts-plan-for": (["--plan-for", "mixed"], "--plan-for", NO_HOSTS),
    "decode-prompt-tokens": (["--stage-cpus", "0,1", "--plan-for", "decode", "--plan-prompt-tokens", "4096"],
                             "--plan-prompt-tokens", DECODE),
    "prefill-reply-tokens": (["--stage-cpus", "0,1", "--plan-for", "prefill", "--plan-reply-tokens", "64"],
                             "--plan-reply-tokens", "with --plan-for prefill (only mixed counts an answer)"),
}


@pytest.mark.parametrize(("argv", "flag", "why"), UP_REFUSED.values(), ids=UP_REFUSED.keys())
def test_up_refuses_a_flag_its_layout_does_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    argv: list[str], flag: str, why: str) -> None:
    run_dir = tmp_path / "run"
    model = [] if "--topology" in argv else ["--model", "no-such.gguf"]  # were it not refused: no model, no server
    assert main(["up", *model, *argv, "--run-dir", str(run_dir), "--bind", "127.0.0.1:0"]) == 2
    assert capsys.readouterr().err == f"skippy up: error: {flag} has no effect {why}\n"
    assert not run_dir.exists(), "nothing may start"


PLAN_REFUSED = {
    "latency-concurrency": (["--latency", "--plan-concurrency", "8"], "--plan-concurrency",
                            "with --latency (a latency plan is for one stream); drop one"),
    "one-host-link-delay": (["--link-delay-ms", "20"], "--link-delay-ms", ONE_HOST),
    "one-cpu-set-link-mbps": (["--stage-cpus", "0", "--link-mbps", "100"], "--link-mbps", ONE_HOST),
    "hosts-file-link-delay": (["--hosts", "h.json", "--link-delay-ms", "5"], "--link-delay-ms", HOSTS_FILE),
    "netns-link-mbps": (["--netns", "sk", "--link-mbps", "100"], "--link-mbps", NETNS),
    "latency-prefill": (["--latency", "--plan-for", "prefill"], "--latency",
                        "with --plan-for prefill (a prompt's prefill has no stream count); drop one"),
    "decode-prompt-tokens": (["--plan-for", "decode", "--plan-prompt-tokens", "4096"], "--plan-prompt-tokens", DECODE),
}


@pytest.mark.parametrize(("argv", "flag", "why"), PLAN_REFUSED.values(), ids=PLAN_REFUSED.keys())
def test_plan_refuses_a_flag_its_hosts_do_not_read(capsys: pytest.CaptureFixture[str], argv: list[str], flag: str,
                                                   why: str) -> None:
    assert main(["plan", "--model", "no-such.gguf", *argv]) == 2  # refused before the model is looked for
    assert capsys.readouterr().err == f"skippy plan: error: {flag} has no effect {why}\n"


@pytest.mark.parametrize("argv", [
    ["--topology", "t.json", "--stage-cpus", "0"],  # pins the topology's stages
    ["--split", "3", "--stage-cpus", "0,1", "--lane-count", "2", "--ctx-size", "128", "--no-prefix-cache"],
    ["--model", "m.gguf", "--stage-cpus", "0,1", "--host-mem-mb", "300", "--link-delay-ms", "5", "--link-mbps", "100",
     "--plan-concurrency", "4", "--recalibrate", "--no-replicas"],  # every plan flag describes these hosts
    ["--netns", "sk", "--stage-cpus", "0,1", "--plan-concurrency", "4", "--no-replicas"],
    ["--hosts", "h.json", "--recalibrate"],
    ["--stage-cpus", "0,1", "--plan-for", "mixed", "--plan-prompt-tokens", "4096", "--plan-reply-tokens", "64"],
    ["--model", "m.gguf", "--lane-count", "2"],  # one host, the model whole
])
def test_up_accepts_every_flag_its_layout_reads(argv: list[str]) -> None:
    refuse_unused_up_flags(build_parser().parse_args(["up", *argv]))


@pytest.mark.parametrize("argv", [
    ["--host-mem-mb", "300"],  # the one host's budget
    ["--stage-cpus", "0,1", "--link-delay-ms", "5", "--link-mbps", "100", "--plan-concurrency", "4"],
    ["--latency", "--stage-cpus", "0,1"],
    ["--latency", "--stage-cpus", "0,1", "--plan-for", "mixed", "--plan-reply-tokens", "16"],
    ["--stage-cpus", "0,1", "--plan-for", "prefill", "--plan-prompt-tokens", "20000"],
])
def test_plan_accepts_every_flag_its_hosts_read(argv: list[str]) -> None:
    args = build_parser().parse_args(["plan", *argv])
    refuse_unused_plan_flags(args)
    assert all(h.delay_ms == (5.0 if "--link-delay-ms" in argv else 0.0) for h in plan_cli._hosts(args))


def test_bench_plan_gives_its_even_split_only_the_flags_a_split_reads() -> None:
    flags = ["--stage-cpus", "0,1", "--plan-concurrency", "16", "--no-replicas", "--downstream-wire-delay-ms", "20.0"]
    assert without_plan_flags(flags) == ["--stage-cpus", "0,1", "--downstream-wire-delay-ms", "20.0"]
    argv = ["up", "--split", "3", *without_plan_flags(flags)]
    refuse_unused_up_flags(build_parser().parse_args(argv))
