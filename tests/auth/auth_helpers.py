"""Helpers for the link-authentication tests: keys for a pipeline, a keyed client, intruders, log polls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from pipeline_helpers import Pipeline

from skippy.cli.keys import keys_for_topology
from skippy.client import PipelineClient
from skippy.config import StageTopology
from skippy.config.topology import with_keys_dir
from skippy.protocol import Message, encode
from skippy.transport.curve_guard import LinkKeys
from skippy.transport.curve_keys import client_link_keys, load_key_pair
from skippy.transport.endpoints import request_endpoint

WITHIN_S = 60.0  # bounded waits (not timing claims)


def add_keys(pipe: Pipeline) -> None:
    """`skippy keys --topology` for the pipeline: a pair per stage and the `client` pair, in <dir>/keys."""
    keys_for_topology(pipe.topology, pipe.directory / "keys", ["client"])


def topology_of(pipe: Pipeline) -> StageTopology:
    return with_keys_dir(StageTopology.load(pipe.topology), pipe.topology)


def client_keys(pipe: Pipeline) -> LinkKeys:
    keys = client_link_keys([topology_of(pipe)])
    assert keys is not None
    return keys


async def generate(client: PipelineClient, prompt: list[int], max_tokens: int) -> tuple[list[int], Any]:
    handle = await client.submit(prompt, max_tokens=max_tokens)
    return await asyncio.wait_for(handle.collect(), WITHIN_S)


def stage0_requests(pipe: Pipeline) -> str:
    return request_endpoint(pipe.endpoint(0))


class Intruder:
    """A socket toward a stage: plain (`secret` None) or CURVE with a pair of its own and the stage's key."""

    def __init__(self, ctx: zmq.Context[Any], kind: int, endpoint: str, secret: Path | None = None,
                 server_key: str | None = None) -> None:
        self.socket = ctx.socket(kind)
        self.socket.linger = 0
        if secret is not None:
            assert server_key is not None
            self.socket.curve_publickey, self.socket.curve_secretkey = load_key_pair(secret)
            self.socket.curve_serverkey = server_key.encode()
        self.socket.connect(endpoint)

    def send(self, *messages: Message) -> None:
        """Queue messages (never delivered unless the handshake succeeds; never blocks)."""
        for msg in messages:
            try:
                self.socket.send_multipart(encode(msg), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass

    def close(self) -> None:
        self.socket.close(linger=0)


def logged(pipe: Pipeline, name: str, event: str, where: Callable[[dict[str, Any]], bool] = lambda e: True
           ) -> list[dict[str, Any]]:
    return [e for e in pipe.events(name) if e.get("event") == event and where(e)]


async def until_logged(pipe: Pipeline, name: str, event: str,
                       where: Callable[[dict[str, Any]], bool] = lambda e: True) -> dict[str, Any]:
    """Bounded poll of a process's log for an event."""
    deadline = time.monotonic() + WITHIN_S
    while not (found := logged(pipe, name, event, where)):
        assert time.monotonic() < deadline, f"{name} did not log {event} within {WITHIN_S:g} s: {pipe.log_tail(name)}"
        await asyncio.sleep(0.05)  # poll interval of a bounded poll
    return found[0]
