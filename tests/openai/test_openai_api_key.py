"""`skippy up --openai-api-key KEY`: the OpenAI client needs the key (a wrong one is a 401
AuthenticationError), /health stays open, and the key is on no process's command line nor in any log."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

KEY = "sk-skippy-test-key-7f3a"


def test_up_with_an_api_key(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    with start_up("up-api-key", tiny_llama, "--openai-api-key", KEY) as server:
        assert server.request("GET", "/health").status == 200
        wrong = server.client(api_key="sk-wrong")
        with pytest.raises(openai.AuthenticationError) as info:
            wrong.models.list()
        assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
        wrong.close()
        right = server.client(api_key=KEY)
        reply = right.chat.completions.create(model=server.model_id, max_tokens=3,
                                              messages=[{"role": "user", "content": "hi"}])
        right.close()
        assert reply.choices[0].finish_reason in ("length", "stop")
        commands = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert KEY not in commands
        assert all(KEY not in log.read_text(errors="replace") for log in server.run_dir.glob("*.log"))
