"""A `PipelineClient` never leaves a pending request hanging on a peer that is gone.

Its peer here is a stand-in broker: a ROUTER that takes every message and answers none, in a process
of its own (killed with SIGKILL: the DEALER's monitor reports the disconnect) or in the test (alive
but silent: the status watch gives up after `dead_after_s`). Either way every pending handle gets a
final error event with code pipeline_lost naming the peer (its client may resume it), and the client serves
again once a peer is back.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import zmq
from broker_helpers import WAIT_S, run

from skippy.client import PipelineClient
from skippy.protocol import ErrorCode, FinishReason, Status, StatusQuery, TokenEvents, decode, encode
from skippy.request_events import RequestHandle

SILENT_ROUTER = """
import sys, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(sys.argv[1])
print("bound", flush=True)
while True:
    sock.recv_multipart()
    print("got", flush=True)
"""


async def _final(handle: RequestHandle) -> TokenEvents:
    async def last() -> TokenEvents:
        return (await handle.collect())[1]

    return await asyncio.wait_for(last(), WAIT_S)  # a bound against a hang, not a timing claim


def _silent_router_process(endpoint: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", SILENT_ROUTER, endpoint], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "bound"
    return proc


def test_pending_requests_fail_when_the_broker_process_dies(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/broker.sock"
    proc = _silent_router_process(endpoint)

    async def scenario() -> tuple[list[TokenEvents], int]:
        client = PipelineClient(endpoint, dead_after_s=600.0)  # only the disconnect can fail them here
        try:
            handles = [await client.submit([1, 2, 3], max_tokens=4) for _ in range(3)]
            assert proc.stdout is not None
            for _ in handles:  # connected: the router has them (a kill before the connection would show no disconnect)
                assert await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), WAIT_S) == "got\n"
            proc.kill()
            proc.wait(WAIT_S)
            finals = [await _final(h) for h in handles]
            return finals, len(client.handles)
        finally:
            client.close()

    try:
        finals, pending = run(scenario())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT_S)
    assert pending == 0
    for final in finals:
        assert final.finish_reason == FinishReason.ERROR and final.code == ErrorCode.PIPELINE_LOST
        assert final.error is not None and endpoint in final.error and "lost the connection" in final.error


def test_pending_requests_fail_when_the_broker_stops_answering_and_serve_again(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/broker.sock"
    ctx: zmq.Context[Any] = zmq.Context()
    router: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(endpoint)

    async def answer_statuses() -> None:
        """Read (without blocking the loop) and answer every StatusQuery, the stale ones too."""
        while True:
            while router.poll(0):
                peer, *frames = router.recv_multipart()
                msg = decode(frames)
                if isinstance(msg, StatusQuery):
                    router.send_multipart([peer, *encode(Status(msg.nonce, True, None, 0, 0, 1, 512))])
            await asyncio.sleep(0.01)  # poll interval (the client's status timeout bounds the wait)

    async def scenario() -> tuple[TokenEvents, Status]:
        client = PipelineClient(endpoint, watch_every_s=0.05, dead_after_s=0.3)
        try:
            handle = await client.submit([1, 2, 3], max_tokens=4)  # the router never reads it: a hung broker
            final = await _final(handle)
            answer = asyncio.get_running_loop().create_task(answer_statuses())
            try:
                return final, await client.status(WAIT_S)
            finally:
                answer.cancel()
        finally:
            client.close()

    try:
        final, status = run(scenario())
    finally:
        router.close()
        ctx.term()
    assert final.finish_reason == FinishReason.ERROR and final.code == ErrorCode.PIPELINE_LOST
    assert final.error is not None and "did not answer a status query within 0.3 s" in final.error
    assert status.ready
