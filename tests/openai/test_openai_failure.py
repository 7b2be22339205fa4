"""A stage dies under `skippy up --max-stage-restarts 0`: the open stream ends with an error, /readyz and
new requests say 503 naming the stage, and `skippy up` reports the dead child by name, exits non-zero
and leaves no process behind. (By default `skippy up` restarts the stage: tests/chaos/test_up_restart.py.)

`skippy up` stops everything within one supervision poll of a child dying, which would take the
adapter down before /readyz could be asked. So the test freezes the supervisor (SIGSTOP) before
killing the stage, checks what the still-running broker and adapter report, and then lets the
supervisor go on (SIGCONT) to check its reaction.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import leftover_processes

LONG = 1000
DEADLINE_S = 30.0


def test_killed_stage_fails_stream_readyz_and_up(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    # stage1 never comes back: the stream pauses, then fails at the resume deadline naming it
    with start_up("up-kill", tiny_llama, "--ctx-size", "2048", "--max-stage-restarts", "0",
                  "--openai-resume-timeout-s", "3") as server:
        client = server.client(timeout=DEADLINE_S)
        (stage1,) = server.stage_pids("stage1")
        stream = client.chat.completions.create(model=server.model_id, max_tokens=LONG, stream=True,
                                                messages=[{"role": "user", "content": "tell me a long story"}],
                                                extra_body={"ignore_eos": True})
        chunks = iter(stream)
        assert next(chunks).choices[0].delta.role == "assistant"

        os.kill(server.proc.pid, signal.SIGSTOP)  # freeze the supervisor (stop_up sends SIGCONT in any case)
        try:
            os.kill(stage1, signal.SIGKILL)

            # 1. the open stream ends with an error (an SSE error event, raised by the client as APIError)
            text = []
            with pytest.raises(openai.APIError) as info:
                for chunk in chunks:
                    assert chunk.choices and chunk.choices[0].finish_reason != "length", "stream finished normally"
                    text.append(chunk.choices[0].delta.content or "")
            assert not isinstance(info.value, openai.APITimeoutError), "no error within the client timeout"
            assert "stage stage1 died and did not come back within 3 s (" in info.value.message, info.value.message
            assert len(text) < LONG

            # 2. /readyz turns 503 and names the dead stage (bounded poll: the broker notices on its status poll)
            deadline = time.monotonic() + DEADLINE_S
            while (resp := server.request("GET", "/readyz")).status == 200 and time.monotonic() < deadline:
                time.sleep(0.05)  # poll interval of a bounded poll
            assert resp.status == 503, resp.body
            assert resp.json()["status"] == "not ready"
            assert "stage1" in resp.json()["reason"]

            # 3. new requests are refused with 503 (the broker routes nothing to a pipeline that is not ready)
            for create in (lambda: client.chat.completions.create(model=server.model_id, max_tokens=4,
                                                                  messages=[{"role": "user", "content": "hi"}]),
                           lambda: client.completions.create(model=server.model_id, prompt="hi", max_tokens=4)):
                with pytest.raises(openai.APIStatusError) as refused:
                    create()
                assert refused.value.status_code == 503, refused.value
                assert refused.value.code == "unavailable"
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)

        # 4. the supervisor reports the dead child by name, stops the rest and exits non-zero
        try:
            code = server.proc.wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"skippy up did not exit after stage1 died\n{server.log_tail()}")
        assert code != 0
        stderr = server.stderr_path.read_text()
        assert "stage1 exited with code -9" in stderr and "not restarting: restarts are off" in stderr, stderr
        assert not leftover_processes(server.run_dir)
        client.close()
