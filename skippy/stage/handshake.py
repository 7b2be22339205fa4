"""Handshake between neighbouring stages (Hello -> Ready), and where a stage finds stage 0.

A stage greets its downstream at startup (`open_downstream`) and again whenever its own upstream
greets it (`greet_again`): a Hello starts the chain below afresh, so stage 0 greeting stage 1 after a
stage came back reaches every stage, and the Ready it gets back vouches for the whole chain. Each side
checks the other: the downstream checks its upstream (`check_upstream`: layer contiguity, model
digest, n_embd); the upstream checks the Ready's sender against the topology (`check_downstream`),
so a restarted stage serving another model or layer range is refused. `PROCESS_INCARNATION` names
this process in its heartbeats, so stage 0 tells a restarted stage from one that was only slow.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Callable

import zmq.asyncio

from skippy.config import ConfigError, ServingOptions, StageTopology
from skippy.protocol import ErrorCode, ErrorReport, Hello, Message, ProtocolError, Ready, StageIdentity
from skippy.stage.links import DownstreamLink
from skippy.transport.queues import PullQueue

PROCESS_INCARNATION = f"{os.getpid()}-{secrets.token_hex(4)}"


class HandshakeError(RuntimeError):
    """The downstream refused us or never answered; the message names the endpoint and the flag."""


def check_upstream(upstream: StageIdentity, me: StageIdentity) -> str | None:
    """Why `upstream` cannot feed this stage, or None when it can."""
    if upstream.layer_end != me.layer_start:
        return (
            f"upstream {upstream.stage_id} ends at layer {upstream.layer_end} "
            f"but stage {me.stage_id} starts at layer {me.layer_start}"
        )
    if upstream.model_digest != me.model_digest:
        return (
            f"upstream {upstream.stage_id} serves model {upstream.model_digest[:16]} "
            f"but stage {me.stage_id} serves model {me.model_digest[:16]}"
        )
    if upstream.n_embd != me.n_embd:
        return f"upstream {upstream.stage_id} sends n_embd {upstream.n_embd} but stage {me.stage_id} expects {me.n_embd}"
    return None


def check_downstream(downstream: StageIdentity, me: StageIdentity, topology: StageTopology | None) -> str | None:
    """Why `downstream` (as its Ready names it) cannot follow this stage, or None when it can."""
    if topology is not None and me.stage_index + 1 < len(topology.stages):
        want = topology.stages[me.stage_index + 1]
        if (downstream.stage_id, downstream.layer_start, downstream.layer_end) != (
                want.stage_id, want.layer_start, want.layer_end):
            return (f"downstream answered as {downstream.stage_id} with layers [{downstream.layer_start}, "
                    f"{downstream.layer_end}) but the topology has {want.stage_id} with [{want.layer_start}, "
                    f"{want.layer_end})")
    return check_upstream(me, downstream)


async def await_ready(inbound: PullQueue, options: ServingOptions, early: list[Message],
                      me: StageIdentity | None = None) -> Ready:
    """Wait for the downstream's Ready (checked against `me` and the topology when `me` is given);
    anything else that arrives meanwhile is kept in `early`."""
    downstream = options.config.downstream
    assert downstream is not None
    timeout = options.downstream_connect_timeout_secs
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HandshakeError(
                f"downstream {downstream.stage_id} at {downstream.endpoint} did not say ready within {timeout:g} s "
                "(is it running? raise --downstream-connect-timeout-secs to wait longer)"
            )
        try:
            msg = await asyncio.wait_for(inbound.recv(), remaining)
        except TimeoutError:
            continue
        if isinstance(msg, Ready):
            problem = check_downstream(msg.sender, me, options.topology) if me is not None else None
            if problem is not None:
                raise HandshakeError(f"downstream {downstream.stage_id} at {downstream.endpoint} refused: {problem}")
            return msg
        if isinstance(msg, ErrorReport) and msg.code is ErrorCode.HANDSHAKE:
            raise HandshakeError(f"downstream {downstream.stage_id} at {downstream.endpoint} refused: {msg.message}")
        if not isinstance(msg, ProtocolError):
            early.append(msg)


def connectable(endpoint: str) -> str:
    """A bound endpoint as a peer can dial it (wildcard hosts become loopback)."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:"):
        if endpoint.startswith(wildcard):
            return "tcp://127.0.0.1:" + endpoint[len(wildcard) :]
    return endpoint


def stage0_endpoint(options: ServingOptions) -> str:
    """Where predictions, errors and heartbeats go: stage 0's endpoint from the topology or the upstream peer."""
    cfg = options.config
    if options.topology is not None:
        return options.topology.first().endpoint
    if cfg.upstream is not None and cfg.upstream.stage_index == 0:
        return cfg.upstream.endpoint
    raise ConfigError(
        f"stage {cfg.stage_id}: cannot find stage 0 for direct prediction return and heartbeats; pass --topology"
    )


async def open_downstream(ctx: zmq.asyncio.Context, options: ServingOptions, me: StageIdentity, inbound: PullQueue,
                          on_failure: Callable[[str], None]) -> tuple[DownstreamLink, list[Message]]:
    """Connect to the configured downstream, greet it and wait for its Ready.

    Returns the link (credits sized by --max-inflight, the wire condition applied, `ready` the peer's
    Ready) and whatever else arrived on `inbound` meanwhile, for the caller to dispatch.
    """
    downstream = options.config.downstream
    assert downstream is not None
    link = DownstreamLink(ctx, downstream.endpoint, options.wire, max_inflight=options.max_inflight,
                          on_failure=on_failure)
    early: list[Message] = []
    try:
        await link.send(Hello(me, connectable(inbound.endpoint)))
        link.ready = await await_ready(inbound, options, early, me)
    except BaseException:
        link.close()
        raise
    return link, early


async def greet_again(link: DownstreamLink, me: StageIdentity, inbound: PullQueue, options: ServingOptions,
                      early: list[Message]) -> str | None:
    """Greet the downstream anew (credits reset, Hello) and wait for its Ready (`link.ready`); None when
    it answered, else why not (refused, or no answer within --downstream-connect-timeout-secs)."""
    link.credits.reset()
    link.enqueue(Hello(me, connectable(inbound.endpoint)))  # not awaited: a PUSH toward a dead peer may block
    try:
        link.ready = await await_ready(inbound, options, early, me)
    except HandshakeError as exc:
        return str(exc)
    return None
