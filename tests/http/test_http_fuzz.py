"""Bad input at the front door: a hypothesis fuzz of raw HTTP requests against the real OpenAI adapter.

Random methods, paths, headers and bodies (bytes, any JSON, chat and completion requests with random
and wrong-typed fields), framed by Content-Length or chunked, whole or cut short, unframed, or plain
garbage (fuzz_requests). The adapter runs in a thread's event loop with a fake broker (adapter_helpers):
its real route table (`OpenAIAdapter.router`, what `skippy adapter` serves) under production's limits.
For every request: a whole request gets an answer that is not a 5xx (a valid one may well be a 200);
one cut short or garbage gets a 4xx or the connection closed; and the server still answers
GET /health afterwards. `SKIPPY_FUZZ_EXAMPLES` sets the number of examples (default 300).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from adapter_helpers import FakeBroker, adapter_server
from fuzz_requests import RawRequest, exchange, raw_requests
from hypothesis import HealthCheck, given, note, settings

EXAMPLES = int(os.environ.get("SKIPPY_FUZZ_EXAMPLES", "300"))
HEALTH = RawRequest("GET", "/health", (), b"", "none", (), 0, b"")


@pytest.fixture(scope="module")
def adapter_port(tiny_model: Callable[..., Path]) -> Iterator[tuple[int, FakeBroker]]:
    """The adapter served from an event loop in a thread, for the synchronous hypothesis test."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzzed-adapter", daemon=True)
    thread.start()
    served = adapter_server(tiny_model("llama"))
    try:
        server, broker = asyncio.run_coroutine_threadsafe(served.__aenter__(), loop).result(60)
        try:
            yield server.port, broker
        finally:
            asyncio.run_coroutine_threadsafe(served.__aexit__(None, None, None), loop).result(60)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=raw_requests())
def test_every_request_gets_an_answer_or_a_close_and_the_server_keeps_serving(
        adapter_port: tuple[int, FakeBroker], request: RawRequest) -> None:
    port, _ = adapter_port
    note(f"raw request: {request.raw()!r}")
    status = exchange(port, request)
    if request.complete:
        assert status is not None and status < 500, status
    else:
        assert status is None or 400 <= status < 500, status
    assert exchange(port, HEALTH) == 200


def test_the_fuzz_reached_the_broker(adapter_port: tuple[int, FakeBroker]) -> None:
    """Runs after the fuzz (file order): some fuzzed requests were valid generations, so the fuzz got past
    parsing into the adapter's generation path, not only its error paths."""
    _, broker = adapter_port
    assert broker.submitted > 0
