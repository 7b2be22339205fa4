"""The OpenAI adapter: its routes, `/` (GET and HEAD: the server's name), health and readiness, /v1/models and
/v1/models/{id} (each model with its context: vLLM's `max_model_len`, llama-server's `meta.n_ctx_train` and
`meta.n_ctx`), /metrics, /detokenize.

The generation routes are skippy.adapter.completions, the OpenAI Responses API skippy.adapter.agents.responses_api and
the Anthropic Messages API skippy.adapter.agents.anthropic_api (both translated onto the chat route); /tokenize,
/apply-template and the chat input-token count are skippy.adapter.prompt_routes; /props and /slots
skippy.adapter.pipeline_info; the live pipeline page /dashboard is skippy.adapter.dashboard. `router` is the one
route table of the adapter (what `skippy adapter` serves):
every route, the dashboard's included, is counted, answers CORS preflights and carries CORS headers
for the allowed origins (skippy.http.cors), and with an API key wants it as a Bearer token, all but
/health and /readyz (skippy.http.auth; the dashboard's routes also take its `?key=` and cookie, and `/` wants
the key too). Each route ignores request fields it does not know, or refuses them with `strict_request_fields`
(skippy.adapter.request_fields.UnknownFields).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from skippy.adapter.agents.anthropic_api import MessagesApi, anthropic_envelope
from skippy.adapter.agents.responses_api import ResponsesApi
from skippy.adapter.chat_template import ChatTemplate
from skippy.adapter.completions import Generation
from skippy.adapter.dashboard import Dashboard
from skippy.adapter.pipeline_info import PipelineInfo, StageRange
from skippy.adapter.prompt_routes import PromptRoutes
from skippy.adapter.request_fields import UnknownFields
from skippy.adapter.request_metrics import Metrics
from skippy.adapter.resume import DEFAULT_RESUME_TIMEOUT_S, ResumingClient
from skippy.adapter.sampling_defaults import model_sampling_defaults
from skippy.adapter.tokenize import detokenize
from skippy.client import PipelineClient
from skippy.config.serving import DEFAULT_MAX_TOKENS
from skippy.http.auth import ApiKey
from skippy.http.cors import CorsPolicy
from skippy.http.errors import HttpError
from skippy.http.server import Request, Response, Router, StreamResponse, json_response
from skippy.http.sse import DEFAULT_PING_INTERVAL_S
from skippy.log import get_logger
from skippy.protocol import Status
from skippy.request_events import PipelineUnavailable
from skippy.runtime.tokenizer import Tokenizer


class OpenAIAdapter:
    def __init__(self, broker: PipelineClient, tokenizer: Tokenizer, template: ChatTemplate, model_id: str,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, cors: CorsPolicy | None = None, api_key: str | None = None,
                 metrics_targets: Path | None = None, stages: Callable[[], list[StageRange]] | None = None,
                 ping_interval_s: float | None = DEFAULT_PING_INTERVAL_S, model_card: dict[str, float] | None = None,
                 resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S, strict_request_fields: bool = False) -> None:
        """`metrics_targets`: the run's metrics-targets.json, every process /dashboard shows (None: this one);
        `stages`: the pipeline's layer ranges (/props, /slots); `ping_interval_s`: SSE pings (None: none);
        `model_card`: the served model's recommended sampling (skippy.adapter.sampling_defaults);
        `resume_timeout_s`: how long a request lost with its stage 0 or the broker may take to resume
        (skippy.adapter.resume); `strict_request_fields`: a request field no route knows is a 400, not ignored."""
        self.broker = broker
        self.tokenizer = tokenizer
        self.template = template
        self.model_id = model_id
        self.default_max_tokens = default_max_tokens
        self.cors = cors or CorsPolicy()
        self.auth = ApiKey(api_key)
        self.created = int(time.time())
        self.metrics = Metrics()
        self.unknown_fields = UnknownFields(strict_request_fields, self.metrics.count_ignored_field)
        self.log = get_logger()
        self._status: tuple[float, Status] | None = None
        self.resuming = ResumingClient(broker, resume_timeout_s, self.metrics.resumed.inc)
        self.generate = Generation(self.resuming, tokenizer, template, model_id, default_max_tokens, self.metrics,
                                   self.status, model_sampling_defaults(tokenizer.model, model_card),
                                   ping_interval_s)
        self.prompts = PromptRoutes(self.generate, self.status)
        self.info = PipelineInfo(self.generate, self.status, tokenizer.model.path, stages or list)
        self.dashboard = Dashboard(self.metrics_page, metrics_targets, api_key=api_key)
        self.responses_api = ResponsesApi(self.generate)
        self.messages_api = MessagesApi(self.generate)

    def router(self) -> Router:
        router = Router()
        routes: list[tuple[str, str, Callable[[Request], Awaitable[Response | StreamResponse]]]] = [
            ("GET", "/", self.root), ("HEAD", "/", self.root),
            ("GET", "/health", self.health), ("GET", "/readyz", self.readyz), ("GET", "/v1/models", self.models),
            ("GET", "/v1/models/{id}", self.model),
            ("GET", "/metrics", self.metrics_text),
            ("POST", "/v1/chat/completions", lambda r: self.generate(r, "chat")),
            ("POST", "/v1/completions", lambda r: self.generate(r, "completion")),
            ("POST", "/tokenize", self.prompts.tokenize), ("POST", "/detokenize", self.detokenize)]
        # llama-server's smaller routes: prompts, pipeline info, fill-in-the-middle
        routes += [
            ("POST", "/apply-template", self.prompts.apply_template),
            ("POST", "/v1/chat/completions/input_tokens", self.prompts.input_tokens),
            ("GET", "/props", self.info.props), ("GET", "/slots", self.info.slots),
            ("POST", "/infill", self.generate.infill)]
        pages = {path for _, path, _ in self.dashboard.routes()}  # a browser opens them: ?key= or the cookie too
        routes += self.dashboard.routes()
        # -- the agent APIs: OpenAI Responses and Anthropic Messages, translated onto the chat route
        routes += self.responses_api.routes()
        anthropic = {path for _, path, _ in self.messages_api.routes()}  # errors (the 401 too) in Anthropic's envelope
        routes += self.messages_api.routes()
        # -- end of the agent APIs
        for method, path, handler in routes:
            guarded = self.auth.wrap(path, self.unknown_fields.wrap(path, handler), browser=path in pages)
            if path in anthropic:
                guarded = anthropic_envelope(guarded)
            router.add(method, path, self.cors.wrap(self._counted(path, guarded)))
        for path in {path for _, path, _ in routes}:
            router.add("OPTIONS", path, self.cors.preflight([m for m, p, _ in routes if p == path]))
        return router

    def _counted(self, path: str, handler: Any) -> Any:
        async def counted(request: Request) -> Response | StreamResponse:
            try:
                response = await handler(request)
            except HttpError as exc:
                self.metrics.count_request(path, exc.status)
                raise
            self.metrics.count_request(path, response.status)
            return response

        return counted

    async def status(self, max_age_s: float = 0.5) -> Status:
        now = time.monotonic()
        if self._status is None or now - self._status[0] > max_age_s:
            self._status = (now, await self.broker.status(timeout_s=2.0))
        return self._status[1]

    async def health(self, _: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, _: Request) -> Response:
        try:
            status = await self.status(max_age_s=0.0)
        except PipelineUnavailable as exc:
            return json_response({"status": "not ready", "reason": str(exc)}, 503)
        if not status.ready:
            reason = f"stage {status.dead_stage} is down" if status.dead_stage else "no pipeline is ready"
            return json_response({"status": "not ready", "reason": reason}, 503)
        return json_response({"status": "ready", "running": status.running, "waiting": status.waiting})

    async def root(self, request: Request) -> Response:
        if request.method == "HEAD":
            return Response(200)
        return json_response({"server": "skippy", "model": self.model_id})

    async def _model_object(self) -> dict[str, Any]:
        """The served model, with its context as vLLM (`max_model_len`) and llama-server (`meta`) report it: a
        request's context (null while no pipeline is ready) and the one the model was trained with."""
        n_ctx = await self.info.n_ctx()
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "skippy",
                "max_model_len": n_ctx, "meta": {"n_ctx_train": self.info.n_ctx_train, "n_ctx": n_ctx,
                                                 "n_vocab": self.tokenizer.n_vocab}}

    async def models(self, _: Request) -> Response:
        return json_response({"object": "list", "data": [await self._model_object()]})

    async def model(self, request: Request) -> Response:
        model = request.path.removeprefix("/v1/models/")
        if model != self.model_id:
            raise HttpError(404, f"The model {model!r} does not exist; this server serves {self.model_id!r}",
                            param="model", code="model_not_found")
        return json_response(await self._model_object())

    async def detokenize(self, request: Request) -> Response:
        return detokenize(self.tokenizer, request)

    async def metrics_text(self, _: Request) -> Response:
        return Response(200, await self.metrics_page(), content_type="text/plain; version=0.0.4")

    async def metrics_page(self) -> bytes:
        """This process's /metrics text, the broker's view refreshed first (also read by /dashboard)."""
        try:
            self.metrics.set_pipeline(await self.status())
        except PipelineUnavailable:
            self.metrics.set_pipeline(None)
        return self.metrics.render()
