"""A stage answers bad peers with ErrorReports and keeps serving; its handshake refuses a wrong upstream.

The test acts as stage 0 itself, with raw pyzmq sockets: a PUSH to stage 1's endpoint and a PULL
bound at stage 0's endpoint of the topology (where a final stage sends predictions and heartbeats,
and where this test asks for replies). Stage 1 is the only stage process, so no driver competes
for it (a stage accepts one upstream at a time; a new Hello releases its sessions). Hidden states
for the valid batches come from a real layers-[0, 3) runtime in this process, so the predictions
can be checked against the unsplit model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from msgspec.structs import replace
from pipeline_helpers import N_THREADS, Pipeline, random_prompt, reference_generate

from skippy.protocol import (
    PROTOCOL_VERSION,
    Batch,
    ErrorReport,
    Heartbeat,
    Hello,
    Message,
    Predictions,
    Ready,
    StageIdentity,
    StageTiming,
    Window,
    decode,
    encode,
)
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow

SPLIT = 3
RECV_TIMEOUT_S = 10.0


class RawUpstream:
    """Stage 0 played by hand: PUSH to the stage, PULL bound at stage 0's endpoint."""

    def __init__(self, pipe: Pipeline) -> None:
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(pipe.endpoint(0))
        self.reply_endpoint = pipe.endpoint(0)
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.connect(pipe.endpoint(1))
        self.heartbeats = 0

    def send(self, msg: Message) -> None:
        self.push.send_multipart(encode(msg), copy=True)

    def send_raw(self, frames: list[bytes]) -> None:
        self.push.send_multipart(frames)

    def recv(self, timeout_s: float = RECV_TIMEOUT_S) -> Message:
        """The next message other than a heartbeat (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self.pull.poll(remaining_ms):
                raise AssertionError(f"nothing but heartbeats arrived within {timeout_s:g} s")
            msg = decode(self.pull.recv_multipart(), n_embd=None)
            if isinstance(msg, Heartbeat):
                self.heartbeats += 1
                continue
            return msg

    def expect_error(self, code: str) -> ErrorReport:
        msg = self.recv()
        assert isinstance(msg, ErrorReport), msg
        assert msg.code == code, msg
        assert msg.stage_id == "stage1", msg
        return msg

    def close(self) -> None:
        self.push.close(linger=0)
        self.pull.close(linger=0)
        self.ctx.term()


@pytest.fixture
def single_stage(tiny_model: Callable[..., Path],
                 make_pipeline: Callable[..., Pipeline]) -> Iterator[tuple[Pipeline, StageRuntime, RawUpstream]]:
    pipe = make_pipeline(tiny_model("llama"), [SPLIT], lane_count=2, ctx_size=128)
    assert list(pipe.stages.procs) == ["stage1"]
    head = StageRuntime(RuntimeSpec(model_path=tiny_model("llama"), layer_start=0, layer_end=SPLIT,
                                    ctx_size=128, lane_count=2, n_threads=N_THREADS))
    upstream = RawUpstream(pipe)
    try:
        yield pipe, head, upstream
    finally:
        upstream.close()
        head.close()


def _header(**fields: object) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def test_bad_frames_get_errors_and_stage_keeps_serving(
    single_stage: tuple[Pipeline, StageRuntime, RawUpstream],
) -> None:
    pipe, head, up = single_stage
    me = StageIdentity("stage0", 0, 0, SPLIT, head.model_digest, head.n_embd)

    # handshake refusals name the problem
    up.send(Hello(replace(me, layer_end=SPLIT - 1), up.reply_endpoint))
    refused = up.expect_error("handshake")
    assert f"ends at layer {SPLIT - 1}" in refused.message and f"starts at layer {SPLIT}" in refused.message, refused
    up.send(Hello(replace(me, model_digest="0" * 64), up.reply_endpoint))
    refused = up.expect_error("handshake")
    assert "model" in refused.message and "0" * 16 in refused.message, refused
    up.send(Hello(replace(me, n_embd=head.n_embd + 1), up.reply_endpoint))
    refused = up.expect_error("handshake")
    assert "n_embd" in refused.message, refused

    up.send(Hello(me, up.reply_endpoint))
    ready = up.recv()
    assert isinstance(ready, Ready), ready
    assert (ready.sender.stage_id, ready.sender.layer_start, ready.sender.n_embd) == ("stage1", SPLIT, head.n_embd)
    assert ready.sender.model_digest == head.model_digest

    # garbage frames: each one answered, none fatal
    bad_frames: list[tuple[list[bytes], str]] = [
        ([b"\xc1"], "malformed"),  # not msgpack
        ([b"definitely not a message"], "malformed"),
        ([msgpack.packb([1, 2, 3])], "malformed"),  # header not a map
        ([b"a", b"b", b"c"], "malformed"),  # three frames
        ([_header(v=PROTOCOL_VERSION + 1, k="batch")], "version"),
        ([_header(v=PROTOCOL_VERSION, k="teleport")], "unknown_kind"),
        ([_header(v=PROTOCOL_VERSION, k="batch", batch_id=1)], "malformed"),  # missing fields
        ([_header(v=PROTOCOL_VERSION, k="credit", batch_id=-1, stage_id="x")], "malformed"),
    ]
    for frames, code in bad_frames:
        up.send_raw(frames)
        up.expect_error(code)

    # batches whose activations do not match n_embd
    prompt = random_prompt(9, 77, 400)
    n = len(prompt)
    window = Window(7, 0, n, (n - 1,))
    up.send(Batch(90, (window,), np.zeros((n, head.n_embd - 1), np.float32)))
    assert "n_embd" in up.expect_error("n_embd").message
    up.send(Batch(91, (window,), None))
    up.expect_error("n_embd")
    up.send_raw([encode(Batch(92, (window,), None))[0], b"\x00" * (n * head.n_embd * 4 + 4)])
    up.expect_error("n_embd")

    # ... and the stage still serves: greedy steps equal the unsplit model's
    expected = reference_generate(pipe, [prompt], 4)[0]
    got: list[int] = []
    pos, tokens = 0, np.asarray(prompt, np.int32)
    for batch_id in range(1, 5):
        hidden = head.decode([SessionWindow(7, pos, len(tokens), (len(tokens) - 1,), tokens)]).hidden
        timing = StageTiming("stage0", time.time(), 0.0, 0.0, time.time())
        up.send(Batch(batch_id, (Window(7, pos, len(tokens), (len(tokens) - 1,)),), hidden, (timing,)))
        predictions = up.recv()  # stage 1 answers its upstream stage 0 itself: the credit rides in the predictions
        assert isinstance(predictions, Predictions) and predictions.credit
        assert predictions.batch_id == batch_id
        assert [r.session_id for r in predictions.results] == [7]
        (token,) = predictions.results[0].tokens
        assert [t.stage_id for t in predictions.timings] == ["stage0", "stage1"]
        got.append(token)
        pos += len(tokens)
        tokens = np.array([token], np.int32)
    assert got == expected

    codes = pipe.stop()
    assert codes == {"stage1": 0}
    stopped = pipe.stopped_line("stage1")
    assert stopped["errors"] == len(bad_frames) + 3, stopped
    assert stopped["batches"] == 4, stopped
    events = pipe.events("stage1")
    refusals = [e for e in events if e.get("event") == "handshake_refused"]
    assert len(refusals) == 3
    assert not any(e.get("event") == "stage_failed" for e in events)

