"""`GET /props` and `GET /slots`: what is served, in llama-server's shapes, plus the pipeline's own view.

/props: `n_ctx` (a request's context, prompt and reply; also as vLLM's `max_model_len`), `n_ctx_train` (the
model's trained context), `default_generation_settings` (`n_ctx` per lane and `params`: the sampling a request gets for
the fields it does not set, skippy.adapter.sampling_defaults, with `max_tokens`), `total_slots` (the
generations run at once: the broker's concurrency, by default the stages' lanes),
`model_alias`, `model_path`, `chat_template` (where it came from: `gguf` or llama.cpp's `builtin`; its engine:
`jinja` or `llama.cpp`; `chat_template_caps`: whether it is given the tools and tool turns itself), `bos_token`,
`eos_token`,
`infill` (whether the model has fill-in-the-middle tokens), `stages` (the layer ranges). /slots: one
entry per slot (a generation that can run at once) with `id`, `n_ctx`, `is_processing` and each
stage's layer range, a pipeline view no peer has. The broker reports how many run, not in which lane:
lanes are interchangeable, so the first `running` slots are shown processing. While the pipeline is
down `n_ctx` and `total_slots` are null (/props) and /slots is a 503.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as L

from skippy.adapter.completions import Generation
from skippy.config import StageTopology
from skippy.http.errors import HttpError
from skippy.http.routing import Request, Response, json_response
from skippy.protocol import Status
from skippy.request_events import PipelineUnavailable
from skippy.runtime.context_size import n_ctx_train


@dataclass(frozen=True)
class StageRange:
    stage_id: str
    layer_start: int
    layer_end: int

    def to_json(self) -> dict[str, Any]:
        return {"stage_id": self.stage_id, "layer_start": self.layer_start, "layer_end": self.layer_end}


def stage_ranges(topology: Path | None) -> Callable[[], list[StageRange]]:
    """Each stage's layer range as the run's topology says now (none without one): read at each request, since a
    re-plan after a host is lost writes a new topology over the run's."""
    def read() -> list[StageRange]:
        if topology is None:
            return []
        stages = StageTopology.load(topology).stages
        return [StageRange(s.stage_id, s.layer_start, s.layer_end) for s in sorted(stages, key=lambda s: s.stage_index)]
    return read


class PipelineInfo:
    def __init__(self, generation: Generation, status: Callable[[], Awaitable[Status]], model_path: Path | None,
                 stages: Callable[[], list[StageRange]]) -> None:
        self.generation = generation
        self.status = status
        self.model_path = model_path
        self.stages = stages
        self.n_ctx_train = n_ctx_train(model_path) if model_path is not None else None  # the model's trained context

    async def _status(self) -> Status | None:
        try:
            status = await self.status()
        except PipelineUnavailable:
            return None
        return status if status.ctx_size > 0 else None  # ctx 0: no pipeline is ready

    async def n_ctx(self) -> int | None:
        """A request's context, prompt and reply (None while no pipeline is ready)."""
        status = await self._status()
        return status.ctx_size if status else None

    def _token_text(self, token: int) -> str:
        return self.generation.tokenizer.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

    async def props(self, _: Request) -> Response:
        gen = self.generation
        status = await self._status()
        defaults = gen.sampling_defaults.to_json()
        params = {**{k: v for k, v in defaults.items() if k != "source"}, "max_tokens": gen.default_max_tokens}
        vocab = gen.tokenizer
        return json_response({
            "default_generation_settings": {"n_ctx": status.ctx_size if status else None, "params": params,
                                            "sampling_source": defaults["source"]},
            "total_slots": status.lane_count if status else None,
            "n_ctx": status.ctx_size if status else None,  # as vLLM's max_model_len; the model's own: n_ctx_train
            "max_model_len": status.ctx_size if status else None,
            "n_ctx_train": self.n_ctx_train,
            "model_alias": gen.model_id,
            "model_path": str(self.model_path) if self.model_path is not None else None,
            "chat_template": gen.template.template.decode("utf-8", "replace"),
            "chat_template_source": gen.template.source,
            "chat_template_engine": gen.template.engine,
            "chat_template_caps": {"supports_tools": gen.template.native_tools,
                                   "supports_tool_calls": gen.template.native_tools},
            "bos_token": self._token_text(L.llama_vocab_bos(vocab.vocab)),
            "eos_token": self._token_text(L.llama_vocab_eos(vocab.vocab)),
            "modalities": {"vision": False, "audio": False},
            "infill": not gen.fim.missing(),
            "stages": [s.to_json() for s in self.stages()],
        })

    async def slots(self, _: Request) -> Response:
        status = await self._status()
        if status is None:
            raise HttpError(503, "no pipeline is ready", type="service_unavailable", code="unavailable")
        stages = [s.to_json() for s in self.stages()]
        return json_response([{"id": lane, "n_ctx": status.ctx_size, "is_processing": lane < status.running,
                               "stages": stages} for lane in range(status.lane_count)])
