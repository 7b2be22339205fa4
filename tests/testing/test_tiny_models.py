"""Tiny random-weight GGUF models load and run in llama.cpp (via llama-cpp-python)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

from skippy.testing.tiny_models import FAMILIES, main, tiny_model_path, write_tiny_model  # noqa: E402

TEXT = b"Hello world, the cat"


def _load(path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=2, verbose=False, logits_all=False)


def _greedy(llm: llama_cpp.Llama, prompt: list[int], n: int) -> list[int]:
    """Greedily generate n tokens, checking each step's logits are finite and argmax == token."""
    out: list[int] = []
    for token in llm.generate(prompt, temp=0.0):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        assert np.isfinite(logits).all()
        assert int(np.argmax(logits)) == token
        out.append(token)
        if len(out) == n:
            return out
    raise AssertionError("generator ended early")


@pytest.mark.parametrize("family", FAMILIES)
def test_family_tokenizes_and_generates(family: str, tmp_path: Path) -> None:
    llm = _load(write_tiny_model(family, tmp_path / f"{family}.gguf"))
    try:
        assert llm.metadata["general.architecture"] == family
        tokens = llm.tokenize(TEXT)
        assert tokens[0] == llm.token_bos()
        assert llm.detokenize(tokens) == TEXT
        assert 0 not in tokens  # no <unk>: every piece is in the vocabulary
        assert len(tokens) < len(TEXT)  # word pieces merged, not one token per byte
        generated = _greedy(llm, tokens, 16)
        assert len(set(generated)) > 3, generated
    finally:
        llm.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_write_is_deterministic(family: str, tmp_path: Path) -> None:
    a = write_tiny_model(family, tmp_path / "a.gguf", n_layer=3)
    b = write_tiny_model(family, tmp_path / "b.gguf", n_layer=3)
    c = write_tiny_model(family, tmp_path / "c.gguf", n_layer=3, seed=1)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_gemma3_layout(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_model("gemma3", tmp_path / "g.gguf", n_layer=6))
    names = {t.name for t in reader.tensors}
    assert "output.weight" not in names  # head tied to token_embd
    for suffix in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
        assert f"blk.5.{suffix}.weight" in names
    fields = reader.fields
    assert fields["gemma3.attention.sliding_window"].contents() > 0
    assert fields["gemma3.attention.sliding_window_pattern"].contents() == 3  # layers 2, 5 global
    assert "gemma3.final_logit_softcapping" not in fields


@pytest.mark.parametrize("tensor_type", ["f16", "q8_0"])
def test_tensor_types(tensor_type: str, tmp_path: Path) -> None:
    path = write_tiny_model("llama", tmp_path / "m.gguf", n_layer=2, tensor_type=tensor_type)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_down.weight"] == tensor_type.upper()
    assert types["blk.0.attn_norm.weight"] == "F32"
    llm = _load(path)
    try:
        assert len(set(_greedy(llm, llm.tokenize(TEXT), 8))) > 3
    finally:
        llm.close()


def test_tiny_model_path_caches(tmp_path: Path) -> None:
    first = tiny_model_path("qwen3", tmp_path, n_layer=2)
    mtime = first.stat().st_mtime_ns
    assert tiny_model_path("qwen3", tmp_path, n_layer=2) == first
    assert first.stat().st_mtime_ns == mtime
    assert tiny_model_path("qwen3", tmp_path, n_layer=2, seed=0) == first  # explicit default, same name
    assert tiny_model_path("qwen3", tmp_path, n_layer=3) != first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files left
    with pytest.raises(TypeError):
        tiny_model_path("qwen3", tmp_path, n_layers=2)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    main(["qwen2", str(out), "--n-layer", "2"])
    assert out.read_bytes() == write_tiny_model("qwen2", tmp_path / "api.gguf", n_layer=2).read_bytes()
    assert str(out) in capsys.readouterr().out


def test_mtp_alias_parts_hold_the_full_files_bytes(tmp_path: Path) -> None:
    """`mtp` is the mimo2 family with a NextN block: trunk-only and MTP-only parts split its tensors, byte for byte."""
    from skippy.runtime.gguf_file import GGUFFile

    parts = {part: write_tiny_model("mtp", tmp_path / f"{part}.gguf", part=part) for part in ("full", "trunk", "mtp")}
    files = {part: GGUFFile(path) for part, path in parts.items()}
    try:
        tensors = {part: {t.name: bytes(f.tensor_bytes(t)) for t in f.tensors} for part, f in files.items()}
        assert files["full"].get("general.architecture") == "mimo2"
        assert files["full"].get("mimo2.block_count") == 7 and files["full"].get("mimo2.nextn_predict_layers") == 1
        nextn = {name for name in tensors["full"] if name.startswith("blk.6.")}
        assert "blk.6.nextn.eh_proj.weight" in nextn and not any(n.startswith("blk.6.") for n in tensors["trunk"])
        assert {n for n in tensors["mtp"] if n.startswith("blk.")} == nextn
        for part in ("trunk", "mtp"):
            assert all(tensors["full"][name] == data for name, data in tensors[part].items())
        assert set(tensors["trunk"]) | set(tensors["mtp"]) == set(tensors["full"])
    finally:
        for f in files.values():
            f.close()
    with pytest.raises(ValueError, match="part 'trunk'"):
        write_tiny_model("llama", tmp_path / "x.gguf", part="trunk")
