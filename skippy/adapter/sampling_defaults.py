"""The sampling a request gets for the fields it does not set: the model's own, else llama.cpp's.

A GGUF may state its recommended sampling in `general.sampling.*` (llama.cpp reads the same keys:
`temp`, `top_k`, `top_p`, `min_p`, `penalty_repeat`); a packaged model's model card may too
(skippy.runtime.models: SmolLM2's temperature 0.2, top_p 0.9); every field neither states gets
llama-server's default (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1). A request's own fields
always win, one by one. /props shows the result (and where each value came from); the README's
"Sampling defaults" says the same. OpenAI's own default (temperature 1, nothing else) suits a small model
badly: SmolLM2-135M-Instruct names two colours for "Name three colors." in about half its answers with it,
in 10 of 16 with llama.cpp's defaults and in 16 of 16 with its model card's.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from typing import Any

import llama_cpp as L

from skippy.runtime.llama_model import LlamaModel

LLAMA_SERVER_DEFAULTS: dict[str, float] = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                                          "repeat_penalty": 1.0}
GGUF_KEYS = {"temperature": "general.sampling.temp", "top_k": "general.sampling.top_k",
             "top_p": "general.sampling.top_p", "min_p": "general.sampling.min_p",
             "repeat_penalty": "general.sampling.penalty_repeat"}


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    source: dict[str, str] = field(default_factory=dict)  # field -> "gguf" | "model card" | "llama.cpp"

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LLAMA_SERVER_DEFAULTS} | {"source": dict(self.source)}


LLAMA_CPP_SAMPLING = SamplingDefaults(source={name: "llama.cpp" for name in LLAMA_SERVER_DEFAULTS})


def _meta(model: LlamaModel, key: str) -> str | None:
    buf = ctypes.create_string_buffer(128)
    n = L.llama_model_meta_val_str(model.ptr, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n > 0 else None


def _valid(name: str, value: float) -> bool:
    if not math.isfinite(value):
        return False
    if name == "temperature":
        return value >= 0
    if name == "top_k":
        return value >= 0 and value == int(value)
    if name == "repeat_penalty":
        return value > 0
    return 0 <= value <= 1


def model_sampling_defaults(model: LlamaModel, model_card: dict[str, float] | None = None) -> SamplingDefaults:
    """The GGUF's `general.sampling.*` values where it states valid ones, else `model_card`'s, else llama-server's."""
    values: dict[str, float] = {}
    source: dict[str, str] = {}
    for name, default in LLAMA_SERVER_DEFAULTS.items():
        text = _meta(model, GGUF_KEYS[name])
        try:
            stated = float(text) if text is not None else None
        except ValueError:
            stated = None
        card = (model_card or {}).get(name)
        if stated is not None and _valid(name, stated):
            values[name], source[name] = stated, "gguf"
        elif card is not None:
            values[name], source[name] = card, "model card"
        else:
            values[name], source[name] = default, "llama.cpp"
    return SamplingDefaults(temperature=values["temperature"], top_k=int(values["top_k"]), top_p=values["top_p"],
                            min_p=values["min_p"], repeat_penalty=values["repeat_penalty"], source=source)
