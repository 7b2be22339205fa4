"""skippy.transport.curve_guard without stage processes: the ZAP answers, fail-closed sockets, no plain fallback,
and the queues of skippy.transport over CURVE on a secured context (ipc, as the tests' pipelines)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from zmq.utils import z85

from skippy.protocol import Heartbeat
from skippy.transport.curve_guard import LinkKeyError, LinkKeys, configure_socket, guard_of, secure, secured_context
from skippy.transport.queues import PullQueue, PushQueue

SERVER, CLIENT, STRANGER = (zmq.curve_keypair() for _ in range(3))


def keys(pair: tuple[bytes, bytes], name: str, servers: dict[str, bytes] | None = None) -> LinkKeys:
    return LinkKeys(name, pair[0], pair[1], servers or {}, {SERVER[0]: "stage1", CLIENT[0]: "client"})


def zap_request(mechanism: bytes, *credentials: bytes) -> list[bytes]:
    return [b"peer", b"", b"1.0", b"7", b"skippy", b"127.0.0.1", b"", mechanism, *credentials]


def test_zap_answers() -> None:
    ctx = zmq.Context()
    try:
        guard = secure(ctx, keys(SERVER, "stage1"))
        assert guard_of(ctx) is guard
        assert guard.answer(zap_request(b"CURVE", z85.decode(CLIENT[0])))[4:7] == [b"200", b"OK", b"client"]
        assert guard.answer(zap_request(b"CURVE", z85.decode(STRANGER[0])))[4] == b"400"
        assert guard.answer(zap_request(b"NULL"))[4] == b"400"
        assert guard.answer(zap_request(b"CURVE", b"short"))[4] == b"400"  # not a 32-byte key
        assert guard.answer([b"peer", b"", b"1.0"])[4] == b"400"  # malformed
        assert (guard.accepted, guard.refused) == (1, 4)
        with pytest.raises(RuntimeError, match="already secured"):
            secure(ctx, keys(SERVER, "stage1"))
    finally:
        ctx.term()


def test_sockets_of_a_secured_context() -> None:
    ctx = zmq.Context()
    try:
        secure(ctx, keys(CLIENT, "client", {"ipc:///known.sock": SERVER[0]}))
        sock = ctx.socket(zmq.PUSH)
        try:
            with pytest.raises(LinkKeyError, match="no public key for ipc:///other.sock"):
                configure_socket(ctx, sock, "ipc:///other.sock", server=False)  # never a plain fallback
            configure_socket(ctx, sock, "ipc:///known.sock", server=False)
            assert sock.getsockopt(zmq.MECHANISM) == zmq.CURVE and not sock.getsockopt(zmq.CURVE_SERVER)
        finally:
            sock.close(0)
        server = ctx.socket(zmq.PULL)
        try:
            configure_socket(ctx, server, "ipc:///bound.sock", server=True)
            assert server.getsockopt(zmq.CURVE_SERVER) and server.getsockopt(zmq.ZAP_ENFORCE_DOMAIN) == 1
        finally:
            server.close(0)
    finally:
        ctx.term()


def test_queues_over_curve(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/s.sock"

    async def body() -> Heartbeat:
        with secured_context(keys(SERVER, "stage1")) as server_ctx, \
                secured_context(keys(CLIENT, "client", {endpoint: SERVER[0]})) as client_ctx:
            pull = PullQueue(server_ctx, endpoint)
            push = PushQueue(client_ctx, endpoint)
            try:
                await push.send(Heartbeat("client", "x"))
                msg = await asyncio.wait_for(pull.recv(), 30.0)
                assert isinstance(msg, Heartbeat)
                return msg
            finally:
                push.close()
                pull.close()

    assert asyncio.run(body()) == Heartbeat("client", "x")


class _Lines:
    """A logger that keeps its lines (the guard logs from its threads)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def warning(self, event: str, **fields: object) -> None:
        self.lines.append((event, fields))

    info = error = warning

    def named(self, event: str) -> list[dict[str, object]]:
        return [fields for name, fields in list(self.lines) if name == event]


def test_a_flood_of_strangers_is_remembered_within_the_bound_and_counted(tmp_path: Path) -> None:
    """Strangers with keys the topology does not name, more than the guard remembers: it keeps `max_noted`
    of them, counts the rest (`refused_unnoted`, on /metrics) and logs them as one line, while the known
    client's messages still arrive."""
    from skippy.telemetry.links import LinkMetrics

    endpoint, strangers, bound = f"ipc://{tmp_path}/s.sock", 8, 3

    async def body() -> None:
        server_ctx = zmq.asyncio.Context()
        guard = secure(server_ctx, keys(SERVER, "stage1"), max_noted=bound)
        log = guard.log = _Lines()
        others = [zmq.Context() for _ in range(strangers)]
        try:
            pull = PullQueue(server_ctx, endpoint)
            sockets = []
            for ctx in others:  # each its own key pair, and the server's key: a CURVE handshake the ZAP refuses
                public, secret = zmq.curve_keypair()
                sock = ctx.socket(zmq.PUSH)
                sock.linger = 0
                sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, SERVER[0]
                sock.connect(endpoint)
                sock.send(b"let me in", zmq.NOBLOCK)  # queued at the stranger: never delivered
                sockets.append(sock)
            with secured_context(keys(CLIENT, "client", {endpoint: SERVER[0]})) as client_ctx:
                push = PushQueue(client_ctx, endpoint)
                try:
                    deadline = time.monotonic() + 30.0
                    while guard.refused_unnoted < strangers - bound:  # every stranger refused, some retried
                        assert time.monotonic() < deadline, (guard.refused, guard.refused_unnoted)
                        await asyncio.sleep(0.05)  # poll interval of a bounded poll
                    await push.send(Heartbeat("client", "still served"))
                    msg = await asyncio.wait_for(pull.recv(), 30.0)
                    assert msg == Heartbeat("client", "still served")
                finally:
                    push.close()
            assert len(guard._noted) <= bound
            assert guard.refused >= strangers and guard.refused_unnoted >= strangers - bound
            assert len(log.named("link_refused")) <= bound  # one line per remembered stranger (within LOG_EVERY_S)
            unnoted = log.named("link_refused_unnoted")
            assert len(unnoted) == 1 and unnoted[0]["remembered"] == bound  # the rest: one line in LOG_EVERY_S
            scraped = {m.name: m.samples[0].value for m in LinkMetrics(lambda: guard).collect()}
            assert scraped["skippy_link_refused_unnoted"] >= strangers - bound
            assert scraped["skippy_link_accepted"] >= 1
            for sock in sockets:
                sock.close(0)
            pull.close()
        finally:
            for ctx in others:
                ctx.term()
            server_ctx.term()

    asyncio.run(asyncio.wait_for(body(), 60.0))
