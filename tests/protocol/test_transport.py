"""skippy.transport: PushQueue -> PullQueue over ipc:// and tcp port 0; bad frames come out as ProtocolError."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import numpy as np
import pytest
import zmq
import zmq.asyncio

from skippy.protocol import Batch, Credit, ProtocolError, Window, decode, encode
from skippy.transport.endpoints import ipc_endpoint
from skippy.transport.queues import DealerQueue, PullQueue, PushQueue, RouterQueue

N_ROWS, N_EMBD = 256, 640


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def ctx() -> Iterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture(params=["ipc", "tcp"])
def bind_endpoint(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return ipc_endpoint(tmp_path, "pull.sock") if request.param == "ipc" else "tcp://127.0.0.1:0"


def activation_batch(batch_id: int) -> Batch:
    hidden = np.random.default_rng(batch_id).standard_normal((N_ROWS, N_EMBD), dtype=np.float32)
    windows = (Window(batch_id, 0, N_ROWS - 1, outputs=(N_ROWS - 2,)), Window(10_000 + batch_id, 5, 1))
    return Batch(batch_id, windows, hidden)


@pytest.mark.anyio
async def test_batches_arrive_intact_and_in_order(ctx: zmq.asyncio.Context, bind_endpoint: str) -> None:
    pull = PullQueue(ctx, bind_endpoint, decoder=partial(decode, n_embd=N_EMBD))
    push = PushQueue(ctx, pull.endpoint)
    try:
        assert not pull.endpoint.endswith(":0")
        sent = [activation_batch(i) for i in range(100)]
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def send_all() -> None:
                    for batch in sent:
                        nbytes = await push.send(batch)
                        assert nbytes == len(encode(batch)[0]) + N_ROWS * N_EMBD * 4

                tg.start_soon(send_all)
                for expected in sent:
                    got = await pull.recv()
                    assert isinstance(got, Batch) and got == expected
    finally:
        push.close()
        pull.close()


@pytest.mark.anyio
async def test_garbage_is_reported_and_serving_continues(ctx: zmq.asyncio.Context, bind_endpoint: str) -> None:
    pull = PullQueue(ctx, bind_endpoint, decoder=partial(decode, n_embd=N_EMBD))
    raw = ctx.socket(zmq.PUSH)
    raw.connect(pull.endpoint)
    push = PushQueue(ctx, pull.endpoint)
    try:
        with anyio.fail_after(10):
            garbage = [[b"\xc1not msgpack", b"x", b"y"], [b"\x93\x01\x02\x03"], [encode(Credit(1, "s"))[0], b"1234"]]
            for frames in garbage:
                await raw.send_multipart(frames)
                error = await pull.recv()
                assert isinstance(error, ProtocolError) and error.code == "malformed"
            await push.send(Batch(1, (Window(1, 0, 2),), np.ones((2, 64), np.float32)))
            error = await pull.recv()
            assert isinstance(error, ProtocolError) and error.code == "n_embd"
            await push.send(Credit(7, "s2"))
            assert await pull.recv() == Credit(7, "s2")
    finally:
        raw.close(linger=0)
        push.close()
        pull.close()


def test_ipc_endpoint(tmp_path: Path) -> None:
    assert ipc_endpoint(tmp_path, "a.sock") == f"ipc://{tmp_path.absolute() / 'a.sock'}"
    with pytest.raises(ValueError, match="plain file name"):
        ipc_endpoint(tmp_path, "x/y")
    with pytest.raises(ValueError, match="limit"):
        ipc_endpoint(tmp_path, "s" * 120)


@pytest.mark.anyio
async def test_a_receive_woken_with_nothing_queued_waits_again(ctx: zmq.asyncio.Context, tmp_path: Path) -> None:
    pull = PullQueue(ctx, ipc_endpoint(tmp_path, "pull.sock"))
    push = PushQueue(ctx, pull.endpoint)
    try:
        with anyio.fail_after(10):
            receiving = asyncio.ensure_future(pull.recv())
            while pull._socket._reader is None:  # bounded by fail_after: the recv is waiting on the FD
                await asyncio.sleep(0)
            pull._socket._on_fd()  # the FD fires with nothing queued (a peer's connection torn down mid-message)
            await asyncio.sleep(0)
            assert not receiving.done()
            await push.send(Credit(3, "s1"))
            assert await receiving == Credit(3, "s1")
    finally:
        push.close()
        pull.close()


@pytest.mark.anyio
async def test_sends_the_socket_cannot_take_yet_wait_and_leave_in_order(ctx: zmq.asyncio.Context, tmp_path: Path) -> None:
    endpoint = ipc_endpoint(tmp_path, "late.sock")
    push = PushQueue(ctx, endpoint, sndhwm=1)  # nobody listens yet: the socket fills at once
    pull: PullQueue | None = None
    try:
        with anyio.fail_after(20):
            waiting = [push.send_frames_nowait(encode(Credit(i, "s")))[0] for i in range(20)]
            pending = [w for w in waiting if w is not None]
            assert pending and not any(w.done() for w in pending)  # the socket took only what fit
            pull = PullQueue(ctx, endpoint)
            assert [await pull.recv() for _ in range(20)] == [Credit(i, "s") for i in range(20)]
            await asyncio.gather(*pending)
    finally:
        push.close()
        if pull is not None:
            pull.close()


@pytest.mark.anyio
async def test_a_dealer_sending_while_its_receive_waits_hears_every_reply(ctx: zmq.asyncio.Context, tmp_path: Path) -> None:
    """A send processes the socket's commands, which may clear the FD's signal of a reply: the waiting
    receive must hear of it anyway (the broker's link to stage 0 sends and receives on one DEALER)."""
    router = RouterQueue(ctx, ipc_endpoint(tmp_path, "router.sock"))
    dealer = DealerQueue(ctx, router.endpoint)
    n = 300
    got: list[object] = []
    try:
        with anyio.fail_after(30):

            async def echo() -> None:
                for _ in range(n):
                    client, msg = await router.recv()
                    assert isinstance(msg, Credit)
                    await router.send(client, msg)

            async def read() -> None:
                for _ in range(n):
                    got.append(await dealer.recv())

            async with anyio.create_task_group() as tg:
                tg.start_soon(echo)
                tg.start_soon(read)
                for i in range(n):
                    await dealer.send(Credit(i, "s"))
                    if i % 7 == 0:
                        await asyncio.sleep(0)
        assert got == [Credit(i, "s") for i in range(n)]
    finally:
        dealer.close()
        router.close()


@pytest.mark.anyio
async def test_a_backlog_of_messages_does_not_starve_the_loops_other_tasks(ctx: zmq.asyncio.Context, tmp_path: Path) -> None:
    """A busy stage's receive loop always finds the next batch queued; its heartbeats must still run."""
    pull = PullQueue(ctx, ipc_endpoint(tmp_path, "busy.sock"))
    push = PushQueue(ctx, pull.endpoint)
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    side: asyncio.Future[None] | None = None
    try:
        with anyio.fail_after(10):
            for i in range(50):
                await push.send(Credit(i, "s"))
            assert await pull.recv() == Credit(0, "s")  # everything is queued now
            side = asyncio.ensure_future(other_task())
            await asyncio.sleep(0)
            before = turns
            for i in range(1, 50):
                assert await pull.recv() == Credit(i, "s")
            assert turns - before >= 40, turns - before
    finally:
        if side is not None:
            side.cancel()
        push.close()
        pull.close()
