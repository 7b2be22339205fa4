"""`skippy up` with its defaults (the packaged Gemma 3 270M over 2 stages) serves the official client."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.gemma
def test_default_model_chat_completion(start_up: Callable[..., Any], gemma_path: Path) -> None:
    assert gemma_path.is_file()
    with start_up("up-gemma", None) as server:
        assert server.model_id == "gemma-3-270m-q4_k_m"
        assert sorted(p.name for p in (server.run_dir / "topology").glob("stage*.json")) == ["stage0.json",
                                                                                             "stage1.json"]
        client = server.client()
        r = client.chat.completions.create(model=server.model_id, max_tokens=16, temperature=0,
                                           messages=[{"role": "user", "content": "Write one sentence about cats."}])
        content = r.choices[0].message.content
        assert isinstance(content, str) and content.strip()
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 16
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        client.close()
