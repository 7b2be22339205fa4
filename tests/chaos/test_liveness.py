"""Restarts without processes: liveness (silence, a restarted stage told by its heartbeats' incarnation, a
dead stage that stays dead until the chain's Ready), the heartbeat's incarnation on the wire, and a receive
that libzmq wakes with nothing to read (as when a restarting peer's connection is torn down)."""

from __future__ import annotations

import msgpack

from skippy.driver.liveness import Heard, Liveness
from skippy.protocol import Heartbeat, decode, encode
from skippy.protocol.codec import PROTOCOL_VERSION


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_silence_marks_a_stage_dead_until_it_is_revived() -> None:
    clock = Clock()
    liveness = Liveness(["stage1", "stage2"], dead_after_s=3.0, clock=clock)
    assert liveness.heard("stage1", "p1") is Heard.ALIVE
    clock.now += 3.5
    liveness.heard("stage2", "p2")
    assert liveness.silent() == "stage1"
    assert liveness.mark_dead("stage1") and not liveness.mark_dead("stage2")  # one dead stage at a time
    assert liveness.silent() is None
    assert liveness.heard("stage1", "p1") is Heard.BACK  # talking again, but still dead until greeted
    assert liveness.dead == "stage1"
    assert liveness.revived() == "stage1" and liveness.dead is None


def test_another_incarnation_is_a_restart_however_fast() -> None:
    liveness = Liveness(["stage1"], clock=Clock())
    assert liveness.heard("stage1", "p1") is Heard.ALIVE
    assert liveness.heard("stage1", "p1") is Heard.ALIVE
    assert liveness.heard("stage1", "p2") is Heard.RESTARTED
    assert liveness.heard("stage1", "p2") is Heard.ALIVE
    assert liveness.heard("stage1", "") is Heard.ALIVE  # a peer that does not say is never taken for a restart


def test_heartbeat_incarnation_on_the_wire() -> None:
    assert decode(encode(Heartbeat("stage1", "1234-abcd"))) == Heartbeat("stage1", "1234-abcd")
    older = msgpack.packb({"v": PROTOCOL_VERSION, "k": "heartbeat", "stage_id": "stage1"})  # a peer without the field
    assert decode([older]) == Heartbeat("stage1", "")

