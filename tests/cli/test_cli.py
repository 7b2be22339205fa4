"""The `skippy` command as a user runs it: real subprocesses, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from skippy.runtime.chain import LocalChain
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.stage_runtime import RuntimeSpec, SessionWindow, StageRuntime
from skippy.runtime.tokenizer import Tokenizer
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


@pytest.mark.parametrize("mtp_flag", ["plan", "sidecar"])
def test_native_mtp_asked_of_a_model_without_heads_fails_at_startup(mtp_flag: str, tiny_llama: Path,
                                                                     tmp_path: Path) -> None:
    from skippy.launcher import write_local_topology

    topology, configs = write_local_topology(tmp_path / "t", tiny_llama, 6, [3])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"native_mtp": {"enabled": True, "max_draft_tokens": 2, "min_draft_tokens": 0,
                                               "reject_cooldown_tokens": 0, "suppress_cooldown_drafts": False,
                                               "suppress_cooldown_draft_limit": 0}}))
    extra = (["--openai-speculative-config", str(plan)] if mtp_flag == "plan"
             else ["--openai-native-mtp-draft-model-path", str(tmp_path / "mtp.gguf")])
    out = skippy("stage", "--config", str(configs[0]), "--topology", str(topology),
                 "--openai-bind-addr", "127.0.0.1:0", *extra, env_dir=tmp_path)
    assert out.returncode == 2
    assert "has no MTP heads" in out.stderr and "Traceback" not in out.stderr
