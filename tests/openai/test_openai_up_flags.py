"""`skippy up` hands each serving flag to the process that owns it: stage flags to every stage, prefill
flags to stage 0's driver, admission flags to the broker, the model id and default max tokens to the
adapter (read back from each process's `ready` line and from the API)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from up_helpers import SkippyServer

from skippy.launcher import read_events


def ready_line(server: SkippyServer, name: str) -> dict[str, Any]:
    return next(e for e in read_events(server.run_dir / f"{name}.log") if e.get("event") == "ready")


def test_up_hands_each_flag_to_its_owner(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    flags = ["--openai-prefill-chunk-policy", "fixed", "--openai-prefill-chunk-size", "5",
             "--openai-generation-concurrency", "1", "--openai-generation-queue-capacity", "3",
             "--openai-model-id", "tiny-served", "--openai-default-max-tokens", "7", "--reply-credit-limit", "0"]
    with start_up("up-flags", tiny_llama, *flags) as server:
        stage0, stage1 = ready_line(server, "stage0"), ready_line(server, "stage1")
        assert stage0["prefill"]["policy"] == "fixed" and stage0["prefill"]["chunk_size"] == 5
        assert stage1["reply_credit_limit"] == 0
        broker = ready_line(server, "broker")
        assert (broker["concurrency"], broker["queue_capacity"]) == (1, 3)
        assert ready_line(server, "adapter")["model_id"] == server.model_id == "tiny-served"
        client = server.client()
        prompt = "one two three four five six seven eight nine ten eleven twelve"  # several 5-token chunks
        reply = client.completions.create(model="tiny-served", prompt=prompt, temperature=0,
                                          extra_body={"ignore_eos": True})
        client.close()
        assert reply.usage is not None and reply.usage.prompt_tokens > 10
        assert reply.usage.completion_tokens == 7  # --openai-default-max-tokens, not the default 16
