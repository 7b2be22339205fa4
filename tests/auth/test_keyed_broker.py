"""A keyed broker: its topologies have link keys and it binds tcp, so its own ROUTER is a CURVE server.

It serves with the client pair it dials stage 0 with (`<keys_dir>/client.key_secret`) and admits only
the topology's clients. A plain client and a client with a key the topology does not name are refused
(logged, never answered, no request of theirs reaches stage 0); a client with the pair is served, and
so is `skippy adapter --link-secret-key` (its `--broker-public-key` defaulting to the pair's own).
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Callable
from pathlib import Path

import zmq
from auth_helpers import Intruder, generate, logged, topology_of, until_logged
from pipeline_helpers import Pipeline, run

from skippy.client import PipelineClient
from skippy.protocol import StatusQuery, Submit
from skippy.transport.curve_guard import LinkKeys, secured_context
from skippy.transport.curve_keys import load_key_pair


def _keys(name: str, secret: Path, endpoint: str, server_key: str) -> LinkKeys:
    public, secret_key = load_key_pair(secret)
    return LinkKeys(name, public, secret_key, {endpoint: server_key.encode()}, {})


def _completion(url: str) -> tuple[int, dict[str, object]]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 3,
                                                             "ignore_eos": True}), {"content-type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def test_a_keyed_broker_serves_its_clients_and_refuses_strangers(tiny_model: Callable[..., Path],
                                                                  keyed_pipeline: Callable[..., Pipeline],
                                                                  stranger: tuple[Path, str]) -> None:
    model = tiny_model("llama")
    pipe = keyed_pipeline(model, [3], lane_count=2, ctx_size=256)
    client_secret = Path(str(topology_of(pipe).keys_dir)) / "client.key_secret"
    ready = pipe.stages.start_process("broker", ["broker", "--bind", "tcp://127.0.0.1:0", "--pipeline",
                                                 str(pipe.topology)])
    endpoint = ready["endpoint"]
    secured = run(until_logged(pipe, "broker", "links_secured"))
    broker_key = secured["public_key"]
    assert broker_key == load_key_pair(client_secret)[0].decode()  # it serves with the client pair
    stranger_secret, stranger_key = stranger

    async def body() -> str | None:
        with secured_context(_keys("client", client_secret, endpoint, broker_key)) as ctx:
            intruders = [Intruder(ctx, zmq.DEALER, endpoint), Intruder(ctx, zmq.DEALER, endpoint, stranger_secret, broker_key)]
            keyed = PipelineClient(endpoint, ctx)
            try:
                for i, intruder in enumerate(intruders):
                    intruder.send(Submit(f"intruder-{i}", (5, 6, 7), {}, 4, ()), StatusQuery(7))
                await until_logged(pipe, "broker", "link_handshake_failed")
                await until_logged(pipe, "broker", "link_refused", lambda e: e.get("public_key") == stranger_key)
                for intruder in intruders:  # refused at the handshake: nothing of theirs is delivered, no answer
                    assert await intruder.socket.poll(500) == 0
                deadline = asyncio.get_running_loop().time() + 60.0
                while not (await keyed.status(timeout_s=10.0)).ready:  # bounded poll: the broker polls stage 0
                    assert asyncio.get_running_loop().time() < deadline, "keyed broker never ready"
                    await asyncio.sleep(0.05)  # poll interval of a bounded poll
                _, final = await generate(keyed, [5, 6, 7, 8], 4)
                return final.finish_reason
            finally:
                for intruder in intruders:
                    intruder.close()
                keyed.close()

    assert run(body()) == "length"
    adapter = pipe.stages.start_process("adapter", ["adapter", "--broker", endpoint, "--model", str(model),
                                                    "--model-id", "tiny", "--bind", "127.0.0.1:0",
                                                    "--link-secret-key", str(client_secret)])
    status, reply = _completion(adapter["url"])
    assert status == 200, reply
    assert reply["usage"]["completion_tokens"] == 3  # type: ignore[index]
    codes = pipe.stop()
    assert codes["broker"] == 0 and codes["adapter"] == 0, codes
    done = logged(pipe, "broker", "request_done")
    assert len(done) == 2 and not [e for e in done if "intruder" in str(e.get("request_id"))]
    assert not [e for e in pipe.events("stage0") if "intruder" in str(e.get("request_id", ""))]
