"""Authenticated stage links (CURVE): strangers are refused and logged, nothing of theirs runs, serving goes on.

The pipeline's topology has keys (`skippy keys --topology`), every stage is a process, and requests go
through stage 0's request endpoint with the topology's `client` pair. While a long request decodes:
- a plain (NULL mechanism) client and a CURVE client whose key the topology does not name send a
  Hello, a SetWire and a malformed frame to stage 1's activation socket, and a Submit to stage 0's
  request endpoint;
- each stage logs the refusal (`link_refused` with the stranger's key, `link_handshake_failed` for the
  plain one), and none of their frames is acted on: no `upstream_accepted` but stage 0's, no
  `wire_changed`, no `bad_message`, no request of theirs at stage 0;
- the long request and the next ones complete.
A stage process whose key is not the topology's (a rogue in stage 1's place) is refused by stage 0
and the pipeline stays down until the real stage 1 is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from auth_helpers import (
    Intruder,
    client_keys,
    generate,
    logged,
    stage0_requests,
    topology_of,
    until_logged,
)
from pipeline_helpers import Pipeline, random_prompt, run
from revive_helpers import edited_json

from skippy.client import PipelineClient
from skippy.protocol import Hello, SetWire, StageIdentity, Submit
from skippy.transport.curve_guard import secured_context
from skippy.transport.curve_keys import write_key_pair


def _intrusions(pipe: Pipeline, ctx: zmq.Context[Any], stranger: Path) -> list[Intruder]:
    topology = topology_of(pipe)
    stage1, stage0 = topology.stages[1], topology.stages[0]
    assert stage1.public_key is not None and stage0.public_key is not None
    fake = StageIdentity("stage0", 0, 0, 3, "0" * 64, 64)
    intruders = []
    for secret in (None, stranger):
        to_stage1 = Intruder(ctx, zmq.PUSH, stage1.endpoint, secret, stage1.public_key)
        to_stage1.send(Hello(fake, "ipc:///nonexistent/reply"), SetWire(250.0, None))
        to_stage1.socket.send_multipart([b"\x93garbage"], flags=zmq.NOBLOCK)
        to_stage0 = Intruder(ctx, zmq.DEALER, stage0_requests(pipe), secret, stage0.public_key)
        to_stage0.send(Submit(f"intruder-{'plain' if secret is None else 'stranger'}", (5, 6, 7), {}, 4, ()))
        intruders += [to_stage1, to_stage0]
    return intruders


def test_strangers_are_refused_logged_and_never_served(tiny_model: Callable[..., Path],
                                                       keyed_pipeline: Callable[..., Pipeline],
                                                       stranger: tuple[Path, str]) -> None:
    pipe = keyed_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=512)
    stranger_secret, stranger_key = stranger

    async def body() -> list[Any]:
        with secured_context(client_keys(pipe)) as ctx:
            client = PipelineClient(stage0_requests(pipe), ctx)
            intruders: list[Intruder] = []
            try:
                first = await generate(client, random_prompt(8, 1, 400), 6)
                long = asyncio.ensure_future(generate(client, random_prompt(8, 2, 400), 200))
                intruders = _intrusions(pipe, ctx, stranger_secret)
                for name in ("stage0", "stage1"):
                    await until_logged(pipe, name, "link_refused", lambda e: e.get("public_key") == stranger_key)
                    await until_logged(pipe, name, "link_handshake_failed")
                during = await long
                after = await generate(client, random_prompt(8, 3, 400), 6)
                return [first, during, after]
            finally:
                for intruder in intruders:
                    intruder.close()
                client.close()

    results = run(body())
    assert [final.finish_reason for _, final in results] == ["length"] * 3
    assert [len(tokens) for tokens, _ in results] == [6, 200, 6]
    codes = pipe.stop()
    assert codes == {"stage0": 0, "stage1": 0}, codes
    assert [e["upstream"] for e in logged(pipe, "stage1", "upstream_accepted")] == ["stage0"]
    for event in ("wire_changed", "bad_message", "no_handshake", "handshake_refused"):
        assert not logged(pipe, "stage1", event), logged(pipe, "stage1", event)
    assert not [e for e in pipe.events("stage0") if "intruder" in str(e.get("request_id", ""))]
    assert pipe.stopped_line("stage1")["errors"] == 0
    secured = logged(pipe, "stage1", "links_secured")
    assert secured and secured[0]["name"] == "stage1" and secured[0]["peers"] == 3  # 2 stages + the client


def test_a_rogue_stage_with_a_key_not_in_the_topology_is_refused(tiny_model: Callable[..., Path],
                                                                   keyed_pipeline: Callable[..., Pipeline]) -> None:
    pipe = keyed_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=256)
    rogue_key = write_key_pair(pipe.directory / "rogue-keys", "stage1")  # its own pair, named stage1

    def rogue_keys(data: dict[str, Any]) -> None:
        data["stages"][1]["public_key"] = rogue_key
        data["keys_dir"] = "rogue-keys"

    rogue_topology = edited_json(pipe.topology, pipe.directory / "rogue-topology.json", rogue_keys)

    async def ready(client: PipelineClient) -> bool:
        return (await client.status(timeout_s=5.0)).ready

    async def until_status(client: PipelineClient, want: bool) -> None:
        async def poll() -> None:
            while await ready(client) != want:
                await asyncio.sleep(0.05)  # poll interval of a bounded poll
        await asyncio.wait_for(poll(), 60.0)

    async def body() -> str | None:
        with secured_context(client_keys(pipe)) as ctx:
            client = PipelineClient(stage0_requests(pipe), ctx)
            try:
                pipe.stages.kill("stage1")
                await until_status(client, False)
                await asyncio.to_thread(pipe.stages.start_process, "rogue",
                                        ["stage", "--config", str(pipe.configs[1]), "--topology", str(rogue_topology)])
                await until_logged(pipe, "stage0", "link_refused", lambda e: e.get("public_key") == rogue_key)
                assert not await ready(client)
                pipe.stages.kill("rogue")
                await asyncio.to_thread(pipe.stages.start_stage, 1)
                await until_status(client, True)
                _, final = await generate(client, [5, 6, 7, 8], 4)
                return final.finish_reason
            finally:
                client.close()

    assert run(body()) == "length"
    assert not logged(pipe, "rogue", "upstream_accepted")  # stage 0 never got through to it either
