"""The `skippy` command as a user runs it: real subprocesses, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from skippy.cli.main import main
from skippy.runtime.chain import LocalChain
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.tokenizer import Tokenizer
from skippy.runtime.windows import SessionWindow
from skippy.testing.tiny_models import tiny_model_path

REPO = Path(__file__).resolve().parents[2]


def skippy(*args: str, env_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {"SKIPPY_CACHE_DIR": str(env_dir), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    return subprocess.run(
        [sys.executable, "-m", "skippy.cli.main", *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_path("llama", tmp_path_factory.mktemp("models"))


def test_generate_split_prints_the_unsplit_greedy_completion(tiny_llama: Path, tmp_path: Path) -> None:
    prompt = "Hello world, the cat"
    out = skippy("generate", "--model", str(tiny_llama), "--split", "2,4", "--prompt", prompt,
                 "--max-tokens", "12", env_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    chain = LocalChain(RuntimeSpec(model_path=tiny_llama, layer_start=0, layer_end=0, lane_count=1))
    try:
        tokenizer = Tokenizer(chain.stages[0].model)
        tokens = list(chain.generate(tokenizer.encode(prompt), 12, stop_tokens=tokenizer.eog_tokens()))
        expected = tokenizer.decode([t for t in tokens if t not in tokenizer.eog_tokens()])
    finally:
        chain.close()
    assert out.stdout == prompt + expected + "\n"
    assert "stages: [0, 2), [2, 4), [4, 6)" in out.stderr
    assert "writing slice" in out.stderr  # progress while slicing


@pytest.mark.gemma
def test_generate_default_model_two_stages(tmp_path: Path) -> None:
    out = skippy("generate", "--split", "9", "--prompt", "The capital of France is", "--max-tokens", "8",
                 env_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("The capital of France is") and len(out.stdout) > len("The capital of France is") + 5


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["generate", "--model", "/no/such/model.gguf", "--prompt", "x"], "model file not found: /no/such/model.gguf"),
        (["generate", "--model", "{tiny}", "--split", "9", "--prompt", "x"], "split points [9]"),
        (["generate", "--model", "{tiny}", "--temperature", "-1", "--prompt", "x"], "'temperature' must be >= 0"),
        (["slice", "--model", "{tiny}", "--layers", "3:99", "--out", "x.gguf"], "layer range [3, 99) is outside"),
        (["check-config", "--config", "/no/such.json"], "/no/such.json"),
    ],
)
def test_bad_input_is_one_line_without_traceback(args: list[str], needle: str, tiny_llama: Path, tmp_path: Path) -> None:
    out = skippy(*[a.replace("{tiny}", str(tiny_llama)) for a in args], env_dir=tmp_path)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_check_config_names_the_file_and_field(tmp_path: Path) -> None:
    config = json.loads((REPO / "configs/gemma3-2stage/stage0.json").read_text())
    config["lane_cuont"] = 4
    bad = tmp_path / "stage0.json"
    bad.write_text(json.dumps(config))
    out = skippy("check-config", "--config", str(bad), env_dir=tmp_path)
    assert out.returncode == 2 and str(bad) in out.stderr and "lane_cuont" in out.stderr


def test_check_config_refuses_a_split_the_family_forbids(tmp_path: Path) -> None:
    """SmolLM3 skips RoPE on every 4th layer by the slice's own layer index: a stage may start only at a
    multiple of 4, and check-config says so before any stage starts."""
    config = json.loads((REPO / "configs/gemma3-2stage/stage1.json").read_text())
    config.update(model_path=str(tiny_model_path("smollm3", tmp_path / "models")), layer_start=2, layer_end=6)
    path = tmp_path / "stage1.json"
    path.write_text(json.dumps(config))
    out = skippy("check-config", "--config", str(path), env_dir=tmp_path)
    assert out.returncode == 2
    assert "smollm3 may not be split at layer 2" in out.stderr and "multiple of 4" in out.stderr
    config.update(layer_start=4)
    path.write_text(json.dumps(config))
    out = skippy("check-config", "--config", str(path), env_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["family_rules"] == "ok (smollm3, layers [4, 6) of 6)"


@pytest.mark.parametrize("n_stages", [1, 2, 3])
def test_example_configs_resolve(n_stages: int, tmp_path: Path) -> None:
    folder = REPO / f"configs/gemma3-{n_stages}stage"
    for config in sorted(folder.glob("stage*.json")):
        out = skippy("check-config", "--config", str(config), "--topology", str(folder / "topology.json"),
                     env_dir=tmp_path)
        assert out.returncode == 0, out.stderr
        resolved = json.loads(out.stdout)
        assert resolved["max_inflight"] == 4 and resolved["reply_credit_limit"] == 3
        assert resolved["mtp_source"] == "integrated"  # no OpenAI front configured


def test_slice_command_writes_an_artifact_slice_that_loads(tiny_llama: Path, tmp_path: Path) -> None:
    out_path = tmp_path / "s.gguf"
    out = skippy("slice", "--model", str(tiny_llama), "--layers", "2:6", "--out", str(out_path), env_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    gguf = GGUFFile(out_path)
    assert (gguf.get("skippy.slice.layer_start"), gguf.get("skippy.slice.layer_end")) == (2, 6)
    assert gguf.get("llama.block_count") == 4  # final slice: no stop block
    gguf.close()
    hidden = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    logits = []
    for mode, path in (("artifact-slice", out_path), ("runtime-slice", tiny_llama)):
        stage = StageRuntime(RuntimeSpec(model_path=path, layer_start=2, layer_end=6, load_mode=mode))
        rows = stage.decode([SessionWindow(0, 0, 3, (0, 1, 2))], hidden).output_rows[0]
        logits.append(np.stack([stage.logits(r) for r in rows]))
        stage.close()
    assert np.array_equal(logits[0], logits[1])


UNSUPPORTED = {  # flags ({name} is the path of PLANS[name]) -> the start of the one-line refusal
    "mtp-and-ngram": (["--openai-speculative-config", "{mtp_ngram}"],
                      "--openai-speculative-config: {mtp_ngram} sets native_mtp and an ngram proposer without an"
                      " extension"),
    "native-mtp-draft": (["--openai-native-mtp-draft-model-path", "mtp.gguf"],
                         "--openai-native-mtp-draft-model-path needs native_mtp.enabled"),
    "draft-and-ngram": (["--openai-draft-model-path", "draft.gguf", "--openai-speculative-config", "{ngram}"],
                        "--openai-draft-model-path and the ngram proposer of {ngram} cannot both draft; pick one"),
    "window-alone": (["--no-speculative", "--openai-speculative-window", "4"],
                     "--openai-speculative-window needs a proposer: --openai-draft-model-path"),
    "mode-without-adaptive": (["--openai-draft-model-path", "draft.gguf", "--openai-adaptive-speculative-window-mode", "simple"],
                              "--openai-adaptive-speculative-window-mode needs --openai-adaptive-speculative-window"),
}
PLANS = {
    "mtp": {"native_mtp": {"enabled": True, "max_draft_tokens": 2}},
    "mtp_ngram": {"native_mtp": {"enabled": True}, "ngram": {"kind": "cache", "min_ngram": 1, "max_ngram": 4,
                                                            "max_proposal_tokens": 4}},
    "ngram": {"ngram": {"kind": "suffix", "min_ngram": 3, "max_ngram": 8, "max_proposal_tokens": 16}},
}


@pytest.fixture
def local_topology(tiny_llama: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    """(topology, stage configs) of a 2-stage split of the tiny model."""
    from skippy.launcher import write_local_topology

    return write_local_topology(tmp_path / "t", tiny_llama, 6, [3])


@pytest.fixture
def plans(tmp_path: Path) -> dict[str, str]:
    """The paths of PLANS, written as JSON files, by name."""
    paths = {}
    for name, plan in PLANS.items():
        path = tmp_path / f"{name}-plan.json"
        path.write_text(json.dumps(plan))
        paths[name] = str(path)
    return paths


@pytest.mark.parametrize("command", ["stage", "check-config", "up"])
@pytest.mark.parametrize(("flags", "message"), UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_unsupported_flag_fails_at_startup_naming_it(command: str, flags: list[str], message: str,
                                                     local_topology: tuple[Path, list[Path]], plans: dict[str, str],
                                                     tiny_llama: Path, tmp_path: Path) -> None:
    """Every entry point that would start something refuses the flag in one line, before starting it."""
    topology, configs = local_topology
    flags = [f.format(**plans) for f in flags]
    if command == "up":
        run_dir = tmp_path / "run"
        args = ["up", "--model", str(tiny_llama), "--split", "3", "--bind", "127.0.0.1:0", "--run-dir", str(run_dir)]
    else:
        args = [command, "--config", str(configs[0]), "--topology", str(topology)]
    out = skippy(*args, *flags, env_dir=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"skippy {command}: error: {message.format(**plans)}" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    if command == "up":
        assert not list(run_dir.glob("*.log")), "nothing may start"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--openai-speculative-config", "{ngram}", "--openai-speculative-window", "8", "--openai-adaptive-speculative-window"],
         {"plan_path": "{ngram}", "speculative_window": 8, "adaptive_speculative_window": True, "adaptive_mode": "cost"}),
        (["--openai-draft-model-path", "/no/such/draft.gguf", "--openai-draft-n-gpu-layers", "0",
          "--openai-adaptive-speculative-window", "--openai-adaptive-speculative-window-mode", "simple"],
         {"draft_model_path": "/no/such/draft.gguf", "draft_n_gpu_layers": 0, "adaptive_mode": "simple"}),
    ],
    ids=["ngram-adaptive", "draft-model"],
)
def test_check_config_accepts_valid_speculative_flags(flags: list[str], expected: dict[str, object],
                                                      local_topology: tuple[Path, list[Path]], plans: dict[str, str],
                                                      tmp_path: Path) -> None:
    """Valid combinations resolve (the draft model is only opened when the stage starts)."""
    topology, configs = local_topology
    out = skippy("check-config", "--config", str(configs[0]), "--topology", str(topology),
                 *[f.format(**plans) for f in flags], env_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    speculative = json.loads(out.stdout)["speculative"]
    shown = {key: speculative[key] for key in expected}
    assert shown == {key: value.format(**plans) if isinstance(value, str) else value for key, value in expected.items()}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--openai-prefill-chunk-size", "0"], "--openai-prefill-chunk-size must be > 0, got 0"),
        (["--openai-prefill-adaptive-target-ms", "nan"], "--openai-prefill-adaptive-target-ms must be finite and > 0"),
        (["--openai-generation-concurrency", "0"], "--openai-generation-concurrency must be > 0, got 0"),
        (["--openai-generation-concurrency", "3"], "--openai-generation-concurrency must be <= lane_count (2), got 3"),
        (["--openai-default-max-tokens", "0"], "--openai-default-max-tokens must be > 0, got 0"),
        (["--max-inflight", "0"], "--max-inflight must be > 0, got 0"),
        (["--bind", "9337"], "--bind must be host:port, got '9337'"),
        (["--", "--openai-generation-concurrency", "1"], "--openai-generation-concurrency cannot follow --"),
        (["--", "--bind-addr", "127.0.0.1:0"], "--bind-addr cannot follow --"),
        (["--", "--bogus"], "unrecognized arguments: --bogus"),
        (["--ctx-size", "512", "--kv-pool-cells", "100"],
         "--kv-pool-cells: kv_pool_cells (100) must hold at least one context (ctx_size 512)"),
        (["--kv-pool-cells", "-1"], "--ctx-size and --kv-pool-cells must be >= 0 (0: the default), got 0 and -1"),
    ],
)
def test_up_checks_every_flag_before_starting_anything(flags: list[str], message: str, tiny_llama: Path,
                                                       tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = skippy("up", "--model", str(tiny_llama), "--split", "3", "--lane-count", "2", "--bind", "127.0.0.1:0",
                 "--run-dir", str(run_dir), *flags, env_dir=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"skippy up: error: {message}" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not list(run_dir.glob("*.log")), "nothing may start"


def test_stage_rejects_front_flags_without_the_front(local_topology: tuple[Path, list[Path]],
                                                     tmp_path: Path) -> None:
    topology, configs = local_topology
    out = skippy("stage", "--config", str(configs[0]), "--topology", str(topology),
                 "--openai-generation-concurrency", "1", env_dir=tmp_path)
    assert out.returncode == 2
    assert "--openai-generation-concurrency needs --openai-bind-addr" in out.stderr


def test_check_config_shows_stage0_options_without_the_front(local_topology: tuple[Path, list[Path]],
                                                             tmp_path: Path) -> None:
    topology, configs = local_topology
    out = skippy("check-config", "--config", str(configs[0]), "--topology", str(topology),
                 "--openai-prefill-chunk-policy", "fixed", "--openai-prefill-chunk-size", "48", env_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert resolved["prefill"]["policy"] == "fixed" and resolved["prefill"]["chunk_size"] == 48
    assert resolved["openai"] is None and resolved["mtp_source"] == "integrated"


@pytest.mark.parametrize(("argv", "message"), [
    (["generate", "--ctx-size", "-5", "--prompt", "x"],
     "skippy generate: error: --ctx-size must be >= 0 (0: the model's trained context), got -5"),
    (["plan", "--stage-cpus", "0", "--ctx-size", "-5"],
     "skippy plan: error: --ctx-size and --kv-pool-cells must be >= 0 (0: the default), got -5 and 0"),
])
def test_a_negative_context_is_refused_in_one_line(argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == message
