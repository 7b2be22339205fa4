"""The real agent clients against plain `skippy up`: Codex CLI (`codex exec`, the Responses API) and Claude Code
(`claude -p`, the Anthropic Messages API), installed as their users install them (npm, pinned versions:
scripts/setup-agents; skipped, naming what is missing, where they are not installed), each with a fresh HOME and
no network but the server (tests/openai/agent_clients.py).

One `skippy up` serves the module: one stage, the tiny random-weight llama with n_ctx_train 32768 and a 32k
context (Codex's first prompt alone is ~21k tokens of the tiny model's near character-level vocabulary). The
clients talk to it through tests/openai/agent_proxy.py, which records every exchange and is the test hook that
makes the random model act: the server is not told anything. A turn that should call a tool gets a forced call
with known arguments (tool_choice and that tool's schema rewritten); every other model request a short JSON
reply through the API's own structured output, so that it ends (a reply cut at its limit fails both clients'
turns). Everything else the clients send reaches the server as they sent it.

Each test checks: the client exits 0 and prints the model's reply as the server returned it, every request it
made was answered 200, and the server refused nothing (`skippy_http_requests_total` holds status 200 only, no
`skippy_request_errors_total`). Claude Code runs with `--tools Read`: its default tools (~62k tokens here) do not
fit 32k. tests/http/test_http_agent_tool_lists.py checks both clients' full tool lists.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_clients import client_binary, require_a_client, run_client
from agent_proxy import AgentProxy, Exchange, Steer
from up_helpers import SkippyServer

from skippy.bench.agent_client_launch import claude_env, client_env, codex_home

NOTE = "skippy-note-4217"


@pytest.fixture(scope="module")
def agent_server(start_up: Callable[..., Any], tiny_model: Callable[..., Path]) -> Iterator[SkippyServer]:
    require_a_client()
    # --ctx-size 32768 is the model's n_ctx_train: said explicitly while the default context is being changed to it
    with start_up("up-agent-clients", tiny_model("llama", n_ctx_train=32768), "--split", "none",
                  "--ctx-size", "32768") as s:
        yield s


@pytest.fixture
def proxy(agent_server: SkippyServer) -> Iterator[AgentProxy]:
    with AgentProxy(agent_server.port, Steer()) as p:
        yield p
    refused = [line for line in agent_server.request("GET", "/metrics").body.decode().splitlines()
               if (line.startswith("skippy_http_requests_total{") and 'status="200"' not in line)
               or line.startswith("skippy_request_errors_total{")]
    assert not refused, refused


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text(NOTE + "\n")
    return work


def answered(proxy: AgentProxy, printed: str) -> list[Exchange]:
    """The model requests so far, after checking every exchange was a 200 and the last reply is what was printed."""
    assert proxy.exchanges and all(e.status == 200 for e in proxy.exchanges), \
        [(e.method, e.path, e.status, e.response[:300]) for e in proxy.exchanges]
    model = proxy.model_exchanges()
    reply = json.loads(model[-1].text())  # the JSON reply the grammar forced
    assert isinstance(reply["reply"], str)
    assert printed.strip() == model[-1].text().strip(), (printed, model[-1].text())
    return model


# -- Codex CLI ---------------------------------------------------------------------------------------------------
def test_codex_exec_turn_then_resume(agent_server: SkippyServer, proxy: AgentProxy, tmp_path: Path,
                                     workdir: Path) -> None:
    codex = client_binary("codex")
    env = client_env(tmp_path / "home", CODEX_HOME=str(codex_home(tmp_path, proxy.port, agent_server.model_id)))
    first = run_client([codex, "exec", "--skip-git-repo-check", "Say hello."], workdir, env)
    assert first.returncode == 0, first.explain()
    print(f"codex exec: first answer after {first.wall_s:.1f} s")
    (turn,) = answered(proxy, first.stdout)
    sent = turn.request()
    assert sent["stream"] is True and "max_output_tokens" not in sent  # Codex's own request, as it sends it
    resumed = run_client([codex, "exec", "resume", "--last", "--skip-git-repo-check", "Say more."], workdir, env)
    assert resumed.returncode == 0, resumed.explain()
    (_, again) = answered(proxy, resumed.stdout)
    history = json.dumps(again.request()["input"])
    assert "Say hello." in history and "Say more." in history
    assert json.dumps(turn.text().strip())[1:-1] in history  # the first reply went back as the assistant's turn


def test_codex_exec_runs_a_tool_the_model_calls(agent_server: SkippyServer, proxy: AgentProxy, tmp_path: Path,
                                                workdir: Path) -> None:
    codex = client_binary("codex")
    proxy.steer = Steer("exec_command", {"cmd": "cat note.txt"})
    env = client_env(tmp_path / "home", CODEX_HOME=str(codex_home(tmp_path, proxy.port, agent_server.model_id)))
    run = run_client([codex, "exec", "--skip-git-repo-check", "What is in note.txt?"], workdir, env)
    assert run.returncode == 0, run.explain()
    call, result = answered(proxy, run.stdout)
    (item,) = [e for e in call.events() if e.get("type") == "response.output_item.done"]
    assert item["item"]["type"] == "function_call" and item["item"]["name"] == "exec_command"
    outputs = [i for i in result.request()["input"] if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [item["item"]["call_id"]] and NOTE in outputs[0]["output"], outputs


# -- Claude Code -------------------------------------------------------------------------------------------------
def test_claude_print_turn_then_continue(agent_server: SkippyServer, proxy: AgentProxy, tmp_path: Path,
                                         workdir: Path) -> None:
    claude = client_binary("claude")
    env = claude_env(tmp_path / "home", proxy.port)
    ask = [claude, "--model", agent_server.model_id, "--tools", "Read", "-p"]
    first = run_client([*ask, "Say hello."], workdir, env)
    assert first.returncode == 0, first.explain()
    print(f"claude -p: first answer after {first.wall_s:.1f} s")
    (turn,) = answered(proxy, first.stdout)
    sent = turn.request()
    assert sent["stream"] is True and {"thinking", "context_management", "metadata"} <= set(sent)
    again = run_client([*ask, "--continue", "Say more."], workdir, env)
    assert again.returncode == 0, again.explain()
    (_, second) = answered(proxy, again.stdout)
    history = json.dumps(second.request()["messages"])
    assert "Say hello." in history and "Say more." in history
    assert json.dumps(turn.text().strip())[1:-1] in history


def test_claude_print_runs_a_tool_the_model_calls(agent_server: SkippyServer, proxy: AgentProxy, tmp_path: Path,
                                                  workdir: Path) -> None:
    claude = client_binary("claude")
    proxy.steer = Steer("Read", {"file_path": str(workdir / "note.txt")})
    run = run_client([claude, "--model", agent_server.model_id, "--tools", "Read", "-p", "What is in note.txt?"],
                     workdir, claude_env(tmp_path / "home", proxy.port))
    assert run.returncode == 0, run.explain()
    call, result = answered(proxy, run.stdout)
    (use,) = [e["content_block"] for e in call.events() if e.get("type") == "content_block_start"
              and e["content_block"]["type"] == "tool_use"]
    assert use["name"] == "Read"
    results = [b for m in result.request()["messages"] if isinstance(m["content"], list) for b in m["content"]
               if b.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [use["id"]] and NOTE in json.dumps(results), results
