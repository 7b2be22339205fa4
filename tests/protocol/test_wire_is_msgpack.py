"""The wire is plain msgpack (skippy.protocol's docstring): a header that skippy's codec encodes is read by the
`msgpack` package, not msgspec, as a map `{"k": kind, "v": PROTOCOL_VERSION, **fields}` with every field
written; a batch's activations follow in frame 1 as raw little-endian float32 in C order; and a header packed
by `msgpack` alone decodes in skippy to the same message, so a peer needs no more than a msgpack library."""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import numpy as np

from skippy.protocol import PROTOCOL_VERSION, Batch, FinishReason, Message, Submit, TokenEvents, Window, decode, encode

SUBMIT = Submit("r-wire", (1, 2, 3), {"temperature": 0.0}, 8, stop_tokens=(2,))
TOKENS = TokenEvents("r-wire", (40, 41), finish_reason=FinishReason.LENGTH)
HIDDEN = np.arange(3 * 4, dtype=np.float32).reshape(3, 4) / 7
BATCH = Batch(9, (Window(5, 0, 2, (1,)), Window(6, 4, 1, (0,))), hidden=HIDDEN)


def header_map(msg: Message) -> dict[str, Any]:
    header = msgpack.unpackb(bytes(encode(msg)[0]), raw=False, strict_map_key=False)
    assert isinstance(header, dict)
    return header


def written_keys(msg_type: type[Message], *left_out: str) -> set[str]:
    """Every field of `msg_type` (its `v` among them) and the kind `k`: what every header carries."""
    return {"k"} | {f.encode_name for f in msgspec.structs.fields(msg_type)} - set(left_out)


def test_a_submit_header_is_a_plain_msgpack_map_of_every_field() -> None:
    header = header_map(SUBMIT)
    assert set(header) == written_keys(Submit)
    assert (header["k"], header["v"]) == ("submit", PROTOCOL_VERSION)
    assert (header["request_id"], header["prompt"], header["max_tokens"]) == ("r-wire", [1, 2, 3], 8)
    assert header["sampling"] == {"temperature": 0.0} and header["stop_tokens"] == [2]


def test_a_token_events_header_is_a_plain_msgpack_map_of_every_field() -> None:
    header = header_map(TOKENS)
    assert set(header) == written_keys(TokenEvents)
    assert (header["k"], header["v"]) == ("tokens", PROTOCOL_VERSION)
    assert (header["request_id"], header["tokens"], header["finish_reason"]) == ("r-wire", [40, 41], "length")
    assert header["error"] is None and header["stats"] is None


def test_a_batch_is_a_msgpack_header_and_raw_little_endian_float32_rows() -> None:
    frames = encode(BATCH)
    header = header_map(BATCH)
    assert set(header) == written_keys(Batch, "hidden")  # the activations travel in frame 1 only
    assert (header["k"], header["v"], header["batch_id"], header["wire_dtype"]) == ("batch", PROTOCOL_VERSION, 9, "f32")
    windows = [(w["session_id"], w["pos_start"], w["n_tokens"], w["outputs"]) for w in header["windows"]]
    assert windows == [(5, 0, 2, [1]), (6, 4, 1, [0])]
    assert len(frames) == 2 and bytes(frames[1]) == HIDDEN.astype("<f4", order="C").tobytes()


def test_headers_packed_by_msgpack_alone_decode_to_the_same_messages() -> None:
    for msg in (SUBMIT, TOKENS):
        assert decode([msgpack.packb(header_map(msg), use_bin_type=True)]) == msg
    rows = HIDDEN.astype("<f4").tobytes()
    assert decode([msgpack.packb(header_map(BATCH), use_bin_type=True), rows]) == BATCH
