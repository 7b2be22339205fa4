"""Where a lost request resumes (ResumePoint) travels inside Submit: it round-trips through the codec, a Submit
without one decodes to none, and a bad value inside it is refused naming its field."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from skippy.protocol import ProtocolError, ResumePoint, Submit, decode, encode

RESUMING = Submit("r-r1", (1, 2, 3), {"seed": 7}, 8, resume_from=ResumePoint((40, 41), (2, 3), 5))


def header_with(**point: Any) -> bytes:
    header = msgpack.unpackb(encode(RESUMING)[0], strict_map_key=False)
    header["resume_from"] = {**header["resume_from"], **point} if point else None
    return msgpack.packb(header, use_bin_type=True)


def refusal(frame: bytes) -> str:
    with pytest.raises(ProtocolError) as info:
        decode([frame])
    assert info.value.code == "malformed", info.value
    return info.value.message


def test_a_resume_point_round_trips_inside_submit() -> None:
    decoded = decode(encode(RESUMING))
    assert decoded == RESUMING
    assert isinstance(decoded, Submit) and decoded.resume_from == ResumePoint((40, 41), (2, 3), 5)
    fresh = decode([header_with()])
    assert isinstance(fresh, Submit) and fresh.resume_from is None
    bare = decode([header_with(chunk_ends=[], draws=0)])
    assert isinstance(bare, Submit) and bare.resume_from == ResumePoint((40, 41))


@pytest.mark.parametrize(
    ("point", "message"),
    [
        ({"draws": -1}, "submit.resume_from.draws: expected int >= 0, got -1"),
        ({"history": []}, "submit.resume_from.history: expected at least 1 item, got 0"),
        ({"history": [40, -2]}, "submit.resume_from.history[1]: expected int in [0, 2147483647], got -2"),
        ({"chunk_ends": [2, "3"]}, "submit.resume_from.chunk_ends[1]: expected int in [0, 2147483647], got str '3'"),
    ],
)
def test_a_bad_value_in_a_resume_point_is_refused_naming_its_field(point: dict[str, Any], message: str) -> None:
    assert refusal(header_with(**point)) == message


def test_a_resume_point_without_history_is_refused_naming_it() -> None:
    header = msgpack.unpackb(encode(RESUMING)[0], strict_map_key=False)
    header["resume_from"] = {"chunk_ends": [2], "draws": 1}
    assert refusal(msgpack.packb(header)) == "submit.resume_from: missing field(s) history"
    header["resume_from"] = [40, 41]
    assert refusal(msgpack.packb(header)) == "submit.resume_from: expected map or nil, got list [40, 41]"
