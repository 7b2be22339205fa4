"""`skippy up --deterministic` on the default model (SmolLM2-135M-Instruct Q4_1, 8 lanes), through the `openai`
client, served as plain `skippy up` serves it (one stage) and split in 2 stages, drafting with a fixed-window
suffix plan: greedy output with speculative decoding equals plain decoding (`--no-speculative`) bitwise, 8 concurrent
requests give the texts each gives alone, and a seeded sampled request run twice (the second from the
prefix cache) gives the same text. Without --deterministic these differ (issue 25: 2 of 6 re-emission
texts matched); docs/deterministic.md says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from up_helpers import SkippyServer, wait_idle

PROMPTS = (
    "Repeat this sentence exactly, twice: The quick brown fox jumps over the lazy dog near the river bank.",
    "Write a Python function that returns the sum of the squares of a list of numbers.",
    "Explain in three sentences why the sky is blue.",
    "List the planets of the solar system in order from the Sun, one per line.",
    # over 256 KV cells alone: a lone decode row then takes llama.cpp's split-KV attention (docs/deterministic.md)
    "Rename `total` to `running_sum` in this code and print the whole code again:\n\n```python\n"
    + "".join(f"def scale_{i}(values, factor={i}):\n    total = 0\n    for v in values:\n        total += v * factor\n"
              f"    return total\n\n" for i in range(8)) + "```",
)
MAX_TOKENS = 48
_PLAN = {"requested_strategy": "ngram", "effective_strategy": "ngram-suffix",
         "ngram": {"kind": "suffix", "min_ngram": 3, "max_ngram": 8, "max_proposal_tokens": 6},
         "verify_window": {"min_tokens": 1, "max_tokens": 6}}
_COMMON = ("--deterministic", "--lane-count", "8", "--openai-generation-concurrency", "8")
# the layouts' flags: one stage, as plain `skippy up` serves one host, and split in two
_LAYOUTS: dict[str, tuple[str, ...]] = {"one-stage": (), "two-stages": ("--split", "15")}


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("detplan") / "plan.json"
    path.write_text(json.dumps(_PLAN))
    return path


@pytest.fixture(scope="module", params=sorted(_LAYOUTS))
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def speculative(start_up: Callable[..., Any], plan: Path, layout: str) -> Iterator[SkippyServer]:
    # a fixed window, so every request drafts (the default policy may find no gain on a loaded host)
    with start_up(f"det-spec-{layout}", None, *_COMMON, *_LAYOUTS[layout], "--openai-speculative-config", str(plan),
                  "--openai-speculative-window", "6") as server:
        yield server


def _greedy(server: SkippyServer, prompt: str) -> tuple[str, dict[str, Any]]:
    client = server.client()
    try:
        reply = client.chat.completions.create(model=server.model_id, max_tokens=MAX_TOKENS, temperature=0,
                                               messages=[{"role": "user", "content": prompt}])
    finally:
        client.close()
    return reply.choices[0].message.content or "", (reply.model_extra or {}).get("timings", {})


def test_concurrent_speculative_greedy_equals_plain_one_at_a_time(start_up: Callable[..., Any],
                                                                  speculative: SkippyServer, layout: str) -> None:
    alone = [_greedy(speculative, p) for p in PROMPTS]
    with ThreadPoolExecutor(8) as pool:  # 8 at once: every lane busy, rows batched together
        together = list(pool.map(lambda p: _greedy(speculative, p)[0], PROMPTS * 2))
    assert sum(t.get("draft_n_accepted", 0) for _, t in alone) > 0  # speculation really ran
    with start_up(f"det-plain-{layout}", None, *_COMMON, *_LAYOUTS[layout], "--no-speculative") as plain_server:
        plain = [_greedy(plain_server, p)[0] for p in PROMPTS]
    assert [text for text, _ in alone] == plain
    assert together == plain * 2


def test_seeded_sampling_is_reproducible_with_the_prefix_cache(speculative: SkippyServer) -> None:
    client = speculative.client()
    messages = [{"role": "user", "content": "Tell me a short story about a robot who learns to paint. " * 8}]
    replies = []
    try:
        for _ in range(2):
            wait_idle(speculative)  # the first one's prompt is recorded when its session is released
            replies.append(client.chat.completions.create(model=speculative.model_id, messages=messages,  # type: ignore[arg-type]
                                                          max_tokens=MAX_TOKENS, temperature=0.9, seed=1234))
    finally:
        client.close()
    first, second = replies
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens > 0  # the second came from the prefix cache
    assert first.choices[0].message.content == second.choices[0].message.content
