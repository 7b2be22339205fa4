"""The packaged models by short name: `default` / `qwen2.5-coder-0.5b`, `smollm2-135m` (SmolLM2-135M-Instruct) and
`gemma3-270m`."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.runtime.errors import ModelError
from skippy.runtime.models import model_card_sampling, model_id_for, resolve_model_path
from skippy.runtime.slices import read_model_info


@pytest.mark.gemma
def test_short_names_resolve_to_the_packaged_ggufs(smollm2_path: Path, gemma_path: Path, qwen05b_path: Path) -> None:
    assert resolve_model_path("default") == resolve_model_path(None) == resolve_model_path("qwen2.5-coder-0.5b")
    assert resolve_model_path(None) == qwen05b_path
    assert resolve_model_path("smollm2-135m") == smollm2_path
    assert resolve_model_path("gemma3-270m") == gemma_path
    assert (read_model_info(smollm2_path).architecture, read_model_info(smollm2_path).n_layer) == ("llama", 30)
    assert (read_model_info(gemma_path).architecture, read_model_info(gemma_path).n_layer) == ("gemma3", 18)
    assert model_id_for("default", qwen05b_path) == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert model_id_for("smollm2-135m", smollm2_path) == "smollm2-135m-instruct-q4_1"
    assert model_id_for("gemma3-270m", gemma_path) == "gemma-3-270m-q4_k_m"
    assert model_card_sampling(smollm2_path) == {"temperature": 0.2, "top_p": 0.9}
    assert model_card_sampling(gemma_path) == {}


def test_a_path_is_a_path_and_a_missing_one_names_the_short_names(tmp_path: Path) -> None:
    gguf = tmp_path / "my-model.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model_path(str(gguf)) == gguf and model_id_for(str(gguf), gguf) == "my-model"
    with pytest.raises(ModelError, match="smollm2-135m, gemma3-270m"):
        resolve_model_path(tmp_path / "missing.gguf")
