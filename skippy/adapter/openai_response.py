"""OpenAI response shapes: completion objects, stream chunks, usage and logprobs, for chat and completions;
and llama-server's native shape for /infill (kind "infill": `content`, `stop`, token counts)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from skippy.protocol import PromptProgress, TokenLogprob
from skippy.protocol.stats import RequestStats

OBJECT = {"chat": "chat.completion", "completion": "text_completion"}
CHUNK_OBJECT = {"chat": "chat.completion.chunk", "completion": "text_completion"}
ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-", "infill": "cmpl-"}


@dataclass
class LogprobEntry:
    text: str
    data: bytes
    logprob: float
    top: list[tuple[str, bytes, float]]


@dataclass
class ResponseShape:
    kind: str
    model: str
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return ID_PREFIX[self.kind] + self.request_id

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def logprobs(self, entries: list[LogprobEntry], offset: int = 0) -> dict[str, Any] | None:
        if not entries:
            return None
        if self.kind == "chat":
            return {"content": [
                {"token": e.text, "logprob": e.logprob, "bytes": list(e.data),
                 "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for t, b, lp in e.top]}
                for e in entries]}
        offsets, pos = [], offset
        for e in entries:
            offsets.append(pos)
            pos += len(e.text)
        return {"tokens": [e.text for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{t: lp for t, _, lp in e.top} for e in entries], "text_offset": offsets}

    def full(self, text: str, finish_reason: str, usage: dict[str, int], entries: list[LogprobEntry],
             extra: dict[str, Any] | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if self.kind == "infill":
            return {"content": text, "stop": True, "finish_reason": finish_reason, "model": self.model,
                    "tokens_predicted": usage["completion_tokens"], "tokens_evaluated": usage["prompt_tokens"]}
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": self.logprobs(entries)}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text or None if tool_calls else text}
            if tool_calls:
                choice["message"]["tool_calls"] = tool_calls
        else:
            choice["text"] = text
        return {**self._envelope(OBJECT[self.kind]), "choices": [choice], "usage": usage, **(extra or {})}

    def chunk(self, text: str | None, finish_reason: str | None = None, entries: list[LogprobEntry] | None = None,
              role: bool = False, offset: int = 0, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if self.kind == "infill":
            return {"content": text or "", "stop": finish_reason is not None,
                    **({"finish_reason": finish_reason} if finish_reason is not None else {})}
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason,
                                  "logprobs": self.logprobs(entries or [], offset)}
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return {**self._envelope(CHUNK_OBJECT[self.kind]), "choices": [choice]}

    def progress_chunk(self, progress: PromptProgress) -> dict[str, Any]:
        """llama-server's `return_progress` event: an empty delta carrying `prompt_progress` (llama-server's keys,
        plus `stages`: each stage's prefill tokens/s on the batches carrying this prompt)."""
        chunk = self.chunk("" if self.kind != "chat" else None, role=self.kind == "chat")
        fields: dict[str, Any] = {"total": progress.total, "cache": progress.cache, "processed": progress.processed,
                                  "time_ms": progress.time_ms}
        fields["stages"] = {s.stage_id: {"tokens_per_s": s.tokens_per_s} for s in progress.stages}
        return {**chunk, "prompt_progress": fields}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self._envelope(CHUNK_OBJECT[self.kind]), "choices": [], "usage": usage}


def timings(stats: RequestStats | None) -> dict[str, Any]:
    """`{"timings": ...}` for a response whose request speculated (llama-server's draft_n names), else {}."""
    spec = stats.speculative if stats is not None else None
    if spec is None:
        return {}
    return {"timings": {"draft_n": spec.proposed, "draft_n_accepted": spec.accepted, "speculative": msgspec.structs.asdict(spec)}}


def usage(prompt_tokens: int, completion_tokens: int, stats: RequestStats | None = None) -> dict[str, Any]:
    """OpenAI usage; `prompt_tokens_details.cached_tokens`: prompt tokens restored from the prefix cache."""
    prefix = stats.prefix_cache if stats is not None else None
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": prefix.cached_tokens if prefix is not None else 0}}


def logprob_entry(lp: TokenLogprob, piece: Any) -> LogprobEntry:
    """`piece(token) -> bytes` renders token text; invalid UTF-8 pieces are shown with replacement chars."""
    data = piece(lp.token)
    top = [(piece(t).decode("utf-8", "replace"), piece(t), p) for t, p in lp.top]
    return LogprobEntry(data.decode("utf-8", "replace"), data, lp.logprob, top)
