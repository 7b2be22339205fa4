"""`skippy bench speculative`: a real one-cell run (stage 1 a real process, the driver in the bench's process),
its report with llama-server peer columns, the `--peers` / `--workloads` checks, and the peer wave against a
real llama-server where one is built (`skippy bench http` builds it once into ~/.cache/skippy; minutes, so the
suite does not build it)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from bench_run import run_bench

from skippy.bench import llama_server_build
from skippy.bench.speculative_load import ModeResult, Timed, closed_loop
from skippy.bench.speculative_peers import parse_peers, peer_wave, running_peers
from skippy.bench.speculative_report import Cell, table, targets
from skippy.bench.speculative_workloads import PROSE, Prompt, PromptFormat, prose_prompts, reemission_prompts, subtask_prompts
from skippy.runtime.models import BENCH_MODEL, resolve_model_path
from skippy.runtime.tokenizer import Tokenizer


def _result(tok_s: float, tokens: list[int]) -> ModeResult:
    r = ModeResult()
    r.add_wave([Timed(tokens, 0.0, 1.0, 1.0 + (len(tokens) - 1) / tok_s, [1.0] * len(tokens))], None, None)
    return r


def test_peer_columns_stand_beside_the_modes_and_stay_out_of_the_targets() -> None:
    out = [1, 2, 3, 4, 5]
    with_peers = Cell("prose", 0.0, 1, 1, {"plain": _result(10, out), "policy": _result(12, out),
                                           "llama-server": _result(5, out), "llama-server-ngram": _result(40, [1, 2, 9])},
                      [[7]], peers=("llama-server", "llama-server-ngram"))
    wired = Cell("prose", 20.0, 1, 1, {"plain": _result(10, out), "policy": _result(11, out)}, [[7]])
    assert list(with_peers.speculative()) == ["policy"]
    assert with_peers.ratio("llama-server") == pytest.approx(0.5) and with_peers.mismatches("llama-server-ngram") == 1
    lines = table([with_peers, wired]).splitlines()
    assert "llama-server tok/s" in lines[0] and "llama-server-ngram tok/s" in lines[0]
    assert lines[2].endswith("| 5.0 | 0.50 | 40.0 | 4.00 |")
    assert lines[3].endswith("| - | - | - | - |")  # no peer in a cell with a hop delay
    goals = targets([with_peers, wired])
    assert all(set(t["worst"]) == {"policy"} for t in goals)  # a llama-server is not a skippy mode to judge


def test_peers_and_workloads_are_checked_with_the_choices_named() -> None:
    assert parse_peers("none") == [] and parse_peers("llama-server-ngram") == ["llama-server-ngram"]
    with pytest.raises(SystemExit, match="unknown vllm; choose from llama-server, llama-server-ngram or none"):
        parse_peers("llama-server,vllm")
    done = _bench(["--workloads", "prose,poetry"], 60)
    assert done.returncode == 2 and "unknown workload 'poetry': choose from re-emission, sub-tasks, prose" in done.stderr
    done = _bench(["--peers", "vllm"], 60)  # refused on the command line, before any server starts
    assert done.returncode == 2 and "unknown vllm; choose from llama-server, llama-server-ngram or none" in done.stderr


def _bench(flags: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`skippy bench speculative FLAGS` in its own process group, killed whole (stage 1 too) if it overruns."""
    return run_bench("speculative", flags, timeout_s)


ONE_STAGE = ["--split", "none", "--model", "smollm2-135m"]


@pytest.mark.parametrize(("shape", "prompt_format", "modes"), [
    ([], "completion", {"plain", "policy"}), (ONE_STAGE, "chat", {"plain", "policy"}),
    ([*ONE_STAGE, "--draft-model", "smollm2-135m"], "chat", {"plain", "policy", "draft-model"}),
], ids=["2-stages", "one-stage", "draft-model"])
def test_one_cell_runs_every_mode_on_the_same_prompts(tmp_path: Path, shape: list[str], prompt_format: str,
                                                      modes: set[str]) -> None:
    done = _bench(["--concurrency", "2", "--delays-ms", "0", "--requests", "3", "--max-tokens", "12", "--workloads",
                   "prose", "--peers", "none", "--out-dir", str(tmp_path), *shape], 300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "bench-speculative.json").read_text())
    (cell,) = [c for c in report["cells"]]
    assert report["prompt_format"] == prompt_format  # the base model's completion text, the instruct model's chat
    assert (cell["workload"], cell["concurrency"], cell["n"]) == ("prose", 2, 4)  # a whole round: 2c requests
    assert set(cell["modes"]) == modes
    for mode in cell["modes"].values():
        assert mode["decode_tokens"] == 4 * 11 and mode["tok_s"] > 0  # 12 tokens each, no end-of-generation
    assert "| prose | 0 | 2 | 4 |" in (tmp_path / "bench-speculative.md").read_text()


@pytest.mark.parametrize(("model", "wanted", "chat"), [("smollm2-135m", "auto", True), (BENCH_MODEL, "auto", False),
                                                     (BENCH_MODEL, "chat", True), ("smollm2-135m", "completion", False)])
def test_workloads_reach_an_instruct_model_as_chat_and_a_base_model_as_text(model: str, wanted: str,
                                                                            chat: bool) -> None:
    path = resolve_model_path(model)
    tokenizer = Tokenizer(path)
    try:
        fmt = PromptFormat.choose(tokenizer, path, wanted)
        code, = reemission_prompts(fmt, 1, 1024)
        text = tokenizer.decode(code.tokens)
        prose = tokenizer.decode(prose_prompts(fmt, 1)[0].tokens)
        subtasks = subtask_prompts(fmt, 4, 2, 1024)
    finally:
        tokenizer.close()
    assert fmt.name == ("chat" if chat else "completion")
    assert "def has_close_elements(" in text  # the code to give back, in either form
    assert ("Rename the function `has_close_elements` to `has_close_elements_v2`" in text) == chat
    assert ("# The same function, renamed to has_close_elements_v2" in text) == (not chat)
    assert PROSE[0] in prose
    assert [p.name for p in subtasks] == ["HumanEval/0", "HumanEval/1", "HumanEval/0/again", "HumanEval/1/again"]
    assert subtasks[0].tokens == subtasks[2].tokens  # the same request again


def test_one_stage_has_no_hop_to_delay(tmp_path: Path) -> None:
    done = _bench(["--split", "0", "--delays-ms", "0,20", "--out-dir", str(tmp_path)], 60)
    assert done.returncode != 0 and "--split none is one stage, no hop to delay: --delays-ms must be 0, got 0,20" \
        in done.stderr
    assert not list(tmp_path.iterdir())


def _built_llama_server() -> Path | None:
    """The llama-server already built in the user's cache, found at collection: the suite's fixtures point
    SKIPPY_CACHE_DIR at a fresh dir, where `running_peers` would otherwise start a build of minutes."""
    root = llama_server_build.build_dir()
    binary = root / "build" / "bin" / "llama-server"
    return binary if (root / "built").exists() and binary.exists() else None


BUILT_LLAMA_SERVER = _built_llama_server()


@pytest.mark.skipif(BUILT_LLAMA_SERVER is None, reason="llama-server not built here (`skippy bench http` builds it)")
def test_a_peer_wave_streams_greedy_tokens_from_a_real_llama_server(tmp_path: Path) -> None:
    model = resolve_model_path(BENCH_MODEL)
    tokenizer = Tokenizer(model)
    try:
        prompts = prose_prompts(PromptFormat(tokenizer, None), 2)
    finally:
        tokenizer.close()
    with running_peers(["llama-server", "llama-server-ngram"], model, tmp_path, 2, 256,
                       binary=BUILT_LLAMA_SERVER) as peers:
        waves = {name: asyncio.run(peer_wave(server, prompts, 10)) for name, server in peers.items()}
        with pytest.raises(RuntimeError, match="llama-server answered HTTP/1.1 400"):  # a prompt beyond the slot
            asyncio.run(peer_wave(peers["llama-server"], [Prompt("long", [5] * 300)], 10))
    for wave in waves.values():
        assert [len(t.tokens) for t in wave] == [10, 10]
        assert all(t.submitted < t.first <= t.last and len(t.times) == 10 for t in wave)
    # greedy: its own n-gram drafting does not change llama-server's output
    assert [t.tokens for t in waves["llama-server"]] == [t.tokens for t in waves["llama-server-ngram"]]


def test_a_round_keeps_c_requests_in_flight_and_sends_the_next_as_one_finishes() -> None:
    async def main() -> tuple[list[Timed], int, list[str]]:
        running: set[str] = set()
        started: list[str] = []
        peak = 0
        gates = {str(i): asyncio.Event() for i in range(5)}

        async def request(prompt: Prompt) -> Timed:
            nonlocal peak
            running.add(prompt.name)
            started.append(prompt.name)
            peak = max(peak, len(running))
            await gates[prompt.name].wait()
            running.discard(prompt.name)
            return Timed(list(prompt.tokens))

        task = asyncio.create_task(closed_loop(request, [Prompt(str(i), [i]) for i in range(5)], 2))
        for name in ("1", "0", "3", "2", "4"):  # finished out of order
            for _ in range(1000):  # bounded: the pool starts `name` once a slot is free
                if name in running:
                    break
                await asyncio.sleep(0)
            assert name in running, (name, started)
            gates[name].set()
        return await task, peak, started

    results, peak, started = asyncio.run(main())
    assert peak == 2 and started == ["0", "1", "2", "3", "4"]
    assert [t.tokens for t in results] == [[0], [1], [2], [3], [4]]  # in prompt order


def test_a_model_drafting_for_itself_is_accepted_across_waves(tmp_path: Path) -> None:
    """The driver's delivery and releases follow the mode in use: the draft model sees every committed token (a model
    drafting greedily for itself agrees with itself) and its lanes come back after each wave (two waves per mode, more
    sessions than the 4 lanes)."""
    done = _bench(["--concurrency", "2", "--delays-ms", "0", "--requests", "8", "--max-tokens", "12", "--workloads",
                   "prose", "--peers", "none", "--out-dir", str(tmp_path), *ONE_STAGE, "--draft-model", "smollm2-135m"], 300)
    assert done.returncode == 0, done.stderr[-2000:]
    (cell,) = json.loads((tmp_path / "bench-speculative.json").read_text())["cells"]
    assert cell["n"] == 8
    totals = cell["modes"]["draft-model"]["totals"]
    assert totals["proposed"] > 0 and totals["accepted"] >= 0.8 * totals["proposed"], totals
