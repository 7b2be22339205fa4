"""A recording HTTP proxy between a real agent client (Codex CLI, Claude Code) and `skippy up`, and the test hook
that steers the tiny model's turns.

The tiny model has random weights: left alone it never calls a tool and rarely ends a reply (an agent's turn
fails on a reply cut at its token limit: Codex on `incomplete`, Claude Code on `max_tokens`). So each model
request (POST /v1/responses, /v1/messages) is rewritten on its way through, and nothing else of it:

- `Steer.tool` set and the conversation holding no call yet: `tool_choice` names that tool, and the tool's
  parameters schema is replaced by `Steer.arguments` (consts), so the grammar forces one call with known
  arguments, which the client then really runs;
- every other model request: no tool (`tool_choice` none) and a short JSON reply (`REPLY_SCHEMA`) through the
  API's structured output (Responses `text.format`, Messages `output_config.format`), so the grammar ends it.

Every exchange is recorded (`Exchange`: the request as the client sent it and as forwarded, the status, the
response body, SSE de-chunked). Each request goes upstream on its own connection (`connection: close` both
ways). `python agent_proxy.py PORT UPSTREAM_PORT OUT.jsonl` runs it unsteered, to record what a client sends
(how tests/data/agent_tools was captured).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MODEL_ROUTES = ("/v1/responses", "/v1/messages")
REPLY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"reply": {"type": "string", "maxLength": 12}},
                                "required": ["reply"], "additionalProperties": False}
_HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "accept-encoding"}


@dataclass
class Steer:
    """What the next model requests are made to answer: a call to `tool` with `arguments` while the conversation
    has none yet (None: text only)."""

    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    sent: bytes  # the body as the client sent it
    forwarded: bytes  # as the proxy forwarded it (steered)
    status: int = 0
    response: bytes = b""

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]

    def request(self) -> dict[str, Any]:
        return dict(json.loads(self.sent))

    def events(self) -> Iterator[dict[str, Any]]:
        """The response's SSE data objects (one object for a response not streamed)."""
        text = self.response.decode()
        if not text.lstrip().startswith("{"):
            for line in text.splitlines():
                if line.startswith("data: "):
                    yield json.loads(line[6:])
        else:
            yield json.loads(text)

    def text(self) -> str:
        """The model's reply text in this response (Responses output_text deltas, Messages text deltas)."""
        parts = []
        for event in self.events():
            if event.get("type") == "response.output_text.delta":
                parts.append(event["delta"])
            elif event.get("type") == "content_block_delta" and event["delta"].get("type") == "text_delta":
                parts.append(event["delta"]["text"])
        return "".join(parts)


def _has_call(body: dict[str, Any]) -> bool:
    items = body.get("input") if isinstance(body.get("input"), list) else []
    if any(isinstance(i, dict) and i.get("type") == "function_call" for i in items):
        return True
    return any(isinstance(m, dict) and isinstance(m.get("content"), list)
               and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in m["content"])
               for m in body.get("messages") or [])


def steered(route: str, body: dict[str, Any], steer: Steer) -> dict[str, Any]:
    """`body` with the tool choice and reply format `steer` asks for (see the module docstring)."""
    responses = route == "/v1/responses"
    if steer.tool is not None and not _has_call(body):
        schema = {"type": "object", "properties": {k: {"const": v} for k, v in steer.arguments.items()},
                  "required": list(steer.arguments), "additionalProperties": False}
        key = "parameters" if responses else "input_schema"
        tools = [{**t, key: schema} if t.get("name") == steer.tool else t for t in body.get("tools") or []]
        assert any(t.get("name") == steer.tool for t in tools), f"the client offered no tool {steer.tool}"
        choice = {"type": "function", "name": steer.tool} if responses else {"type": "tool", "name": steer.tool}
        return {**body, "tools": tools, "tool_choice": choice}
    if responses:
        text = {**(body.get("text") or {}), "format": {"type": "json_schema", "name": "reply", "strict": True,
                                                        "schema": REPLY_SCHEMA}}
        return {**body, "tool_choice": "none", "text": text}
    config = {**(body.get("output_config") or {}), "format": {"type": "json_schema", "schema": REPLY_SCHEMA}}
    return {**body, "tool_choice": {"type": "none"}, "output_config": config}


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2:end + 2 + size]
        pos = end + 4 + size


def _head(raw: bytes) -> tuple[str, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


class AgentProxy:
    """`with AgentProxy(upstream_port) as proxy:` listens on 127.0.0.1:`proxy.port`; `proxy.steer` is read per
    request; `proxy.exchanges` grows as requests are answered."""

    def __init__(self, upstream_port: int, steer: Steer | None = None, port: int = 0) -> None:
        self.upstream_port = upstream_port
        self.steer = steer
        self.exchanges: list[Exchange] = []
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> AgentProxy:
        self._thread.start()
        assert self._ready.wait(10), "the proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def model_exchanges(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST" and e.route in MODEL_ROUTES]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line, headers = _head(await reader.readuntil(b"\r\n\r\n"))
            if headers.get("transfer-encoding", "").lower() == "chunked":
                raw = bytearray()
                while not raw.endswith(b"0\r\n\r\n"):
                    raw += await reader.read(65536)
                body = _dechunk(bytes(raw))
            else:
                body = await reader.readexactly(int(headers.get("content-length", "0")))
            method, path, _ = request_line.split(" ", 2)
            exchange = Exchange(method, path, headers, body, body)
            if self.steer is not None and method == "POST" and exchange.route in MODEL_ROUTES:
                exchange.forwarded = json.dumps(steered(exchange.route, json.loads(body), self.steer)).encode()
            await self._forward(exchange, writer)
            self.exchanges.append(exchange)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away (a killed client); what it had is not an exchange
        finally:
            writer.close()

    async def _forward(self, exchange: Exchange, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        kept = "".join(f"{k}: {v}\r\n" for k, v in exchange.headers.items() if k not in _HOP_BY_HOP)
        up_writer.write(f"{exchange.method} {exchange.path} HTTP/1.1\r\nhost: 127.0.0.1:{self.upstream_port}\r\n{kept}"
                        f"content-length: {len(exchange.forwarded)}\r\nconnection: close\r\n\r\n".encode("latin-1"))
        up_writer.write(exchange.forwarded)
        status_line, headers = _head(await up_reader.readuntil(b"\r\n\r\n"))
        exchange.status = int(status_line.split(" ")[1])
        head = [status_line, *(f"{k}: {v}" for k, v in headers.items() if k not in ("connection", "keep-alive")),
                "connection: close"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        raw = bytearray()
        while chunk := await up_reader.read(65536):
            raw += chunk
            writer.write(chunk)
            await writer.drain()
        up_writer.close()
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        exchange.response = _dechunk(bytes(raw)) if chunked else bytes(raw)


def main(argv: list[str]) -> None:
    """Record unsteered: `python agent_proxy.py PORT UPSTREAM_PORT OUT.jsonl` until interrupted."""
    port, upstream, out = int(argv[0]), int(argv[1]), argv[2]
    with AgentProxy(upstream, port=port) as proxy:
        print(f"recording 127.0.0.1:{proxy.port} -> 127.0.0.1:{upstream} into {out}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    with open(out, "w") as f:
        for e in proxy.exchanges:
            f.write(json.dumps({"method": e.method, "path": e.path, "status": e.status,
                                "body": e.sent.decode(errors="replace")}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
