"""skippy.protocol: every message round-trips, and decode() rejects anything else with ProtocolError only."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from skippy.protocol import (
    MAX_HEADER_BYTES,
    MAX_ROWS,
    MAX_SESSIONS_PER_MESSAGE,
    MAX_WINDOWS,
    PROTOCOL_VERSION,
    Batch,
    CacheCaps,
    Cancel,
    ConfigureSession,
    Credit,
    ErrorCode,
    ErrorReport,
    FinishReason,
    Heartbeat,
    Hello,
    Message,
    Predictions,
    PrefixRef,
    ProtocolError,
    Ready,
    ReleaseSessions,
    SessionPrediction,
    SetWire,
    StageIdentity,
    StageTiming,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
    TokenLogprob,
    Window,
    WireDtype,
    codec,
    decode,
    encode,
)
from skippy.protocol.compiled import compile_schemas
from skippy.protocol.stats import PrefixStats, RequestStats, SpeculativeStats
from skippy.protocol.specs import _int, _str, _Struct

IDENTITY = StageIdentity("s1", 1, 9, 18, "sha256:abc", 640)
TIMING = StageTiming("s1", 1_700_000_000.25, 3.5, 0.0, 1_700_000_000.5)
SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 7, "logit_bias": {13: -math.inf, 42: 1.5}}
HIDDEN = np.arange(3 * 640, dtype=np.float32).reshape(3, 640)
WINDOWS = (Window(7, 0, 2, outputs=(1,)), Window(9, 12, 1, outputs=(0,)))
NO_CACHE_OPS = {"restore": None, "record": [], "evict": []}  # a window's prefix cache fields, empty

EXAMPLES: dict[str, Message] = {
    "hello": Hello(IDENTITY, "tcp://127.0.0.1:5555"),
    "ready": Ready(IDENTITY),
    "batch_tokens": Batch(1, WINDOWS),
    "batch_hidden": Batch(2, WINDOWS, HIDDEN, timings=(TIMING, TIMING)),
    "configure": ConfigureSession(7, SAMPLING),
    "release": ReleaseSessions((7, 9, 2**63 - 1)),
    "credit": Credit(2, "s1"),
    "predictions": Predictions(2, (SessionPrediction(7, (11,)), SessionPrediction(9, ())), (TIMING,)),
    "error": ErrorReport("n_embd", "bad width", "s1", 2, (7, 9)),
    "error_bare": ErrorReport(ErrorCode.BATCH_FAILED, "boom", "s2"),
    "heartbeat": Heartbeat("s1"),
    "ready_cache": Ready(IDENTITY, CacheCaps(4096, 16, 18432)),
    "batch_prefix_cache": Batch(4, (Window(7, 64, 2, (1,), restore=PrefixRef(2**63 - 1, 64), record=(PrefixRef(5, 66),)),
                                    Window(9, 12, 1, (0,), evict=(5, 6))), missed=(3,)),
    "predictions_missed": Predictions(4, (SessionPrediction(9, (1,)),), (TIMING,), missed=(7,)),
}


def header_of(msg: Message) -> dict[Any, Any]:
    return msgpack.unpackb(encode(msg)[0], strict_map_key=False)


def pack(header: Any) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def rejects(frames: list[Any], code: str, *, n_embd: int | None = None) -> str:
    with pytest.raises(ProtocolError) as info:
        decode(frames, n_embd=n_embd)
    assert info.value.code == code, info.value
    assert "\n" not in info.value.message
    return info.value.message


# --- round trips ---


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_kind_round_trips(name: str) -> None:
    msg = EXAMPLES[name]
    assert decode(encode(msg)) == msg
    assert header_of(msg)["v"] == PROTOCOL_VERSION


def test_logit_bias_keeps_int_keys() -> None:
    decoded = decode(encode(EXAMPLES["configure"]))
    assert isinstance(decoded, ConfigureSession)
    assert decoded.sampling["logit_bias"] == {13: -math.inf, 42: 1.5}


def test_hidden_is_zero_copy_both_ways() -> None:
    frames = encode(EXAMPLES["batch_hidden"])
    assert len(frames) == 2 and np.shares_memory(np.frombuffer(frames[1], np.float32), HIDDEN)
    buffer = bytearray(frames[1])
    decoded = decode([frames[0], buffer], n_embd=640)
    assert isinstance(decoded, Batch) and decoded.hidden is not None
    assert not decoded.hidden.flags.writeable and decoded.hidden.shape == (3, 640)
    buffer[0:4] = np.float32(-1.0).tobytes()
    assert decoded.hidden[0, 0] == -1.0  # a view onto the frame, not a copy


def test_hidden_is_converted_to_little_endian_float32_c_order() -> None:
    fortran = np.asfortranarray(HIDDEN.astype(">f8"))
    decoded = decode(encode(Batch(3, WINDOWS, fortran)))
    assert isinstance(decoded, Batch) and decoded.hidden is not None
    assert decoded.hidden.dtype == np.dtype("<f4") and np.array_equal(decoded.hidden, HIDDEN)


def test_numpy_scalars_encode_as_plain_numbers() -> None:
    assert decode(encode(Credit(np.int64(5), "s1"))) == Credit(5, "s1")  # type: ignore[arg-type]


def test_encode_refuses_what_no_peer_accepts() -> None:
    with pytest.raises(ValueError, match="shape"):
        encode(Batch(1, WINDOWS, np.zeros((2, 640), np.float32)))
    with pytest.raises(ValueError, match="MAX_HEADER_BYTES"):
        encode(ErrorReport("x", "y" * MAX_HEADER_BYTES, "s1"))
    with pytest.raises(TypeError):
        encode("hello")  # type: ignore[arg-type]


# --- specific rejections ---


def test_wrong_version_names_both_versions() -> None:
    message = rejects([pack({**header_of(EXAMPLES["credit"]), "v": 99})], "version")
    assert "99" in message and str(PROTOCOL_VERSION) in message


def test_unknown_kind() -> None:
    assert "'bogus'" in rejects([pack({**header_of(EXAMPLES["credit"]), "k": "bogus"})], "unknown_kind")


def test_activation_frame_must_match_n_embd() -> None:
    header, frame = encode(EXAMPLES["batch_hidden"])
    rejects([header, frame], "n_embd", n_embd=64)
    rejects([header], "n_embd", n_embd=640)
    rejects([header, bytes(frame)[:-4]], "n_embd", n_embd=640)
    rejects([header, bytes(frame)[:-1]], "malformed")  # not whole float32 rows
    rejects([header, b""], "malformed")
    tokens_only = decode([header])
    assert isinstance(tokens_only, Batch) and tokens_only.hidden is None


def test_frame_on_non_batch_and_frame_count() -> None:
    header = encode(EXAMPLES["credit"])[0]
    assert "frame 1" in rejects([header, b"\0" * 8], "malformed")
    rejects([], "malformed")
    rejects([header, b"", b""], "malformed")


def test_field_errors_name_the_path() -> None:
    header = header_of(EXAMPLES["batch_tokens"])
    window = header["windows"][1]
    header["windows"] = [{**window, "session_id": 1}, {**window, "session_id": 2}, {**window, "n_tokens": -3}]
    assert rejects([pack(header)], "malformed") == "batch.windows[2].n_tokens: expected int >= 1, got -3"


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("outputs", [1, 1], "strictly increasing"),
        ("outputs", [2], "strictly increasing"),
        ("outputs", [-1], "outputs[0]"),
        ("pos_start", -1, "pos_start"),
        ("session_id", 2**63, "session_id"),
        ("session_id", True, "got bool"),
        ("n_tokens", 2.0, "got 2.0"),
        ("draft", [5, 2**31], "draft[1]"),
    ],
)
def test_window_validation(field: str, value: Any, fragment: str) -> None:
    header = header_of(EXAMPLES["batch_tokens"])
    header["windows"][0][field] = value
    assert fragment in rejects([pack(header)], "malformed")


def test_duplicate_session_in_batch() -> None:
    header = header_of(EXAMPLES["batch_tokens"])
    header["windows"][1]["session_id"] = header["windows"][0]["session_id"]
    assert "duplicate session 7" in rejects([pack(header)], "malformed")


def test_missing_and_mistyped_fields() -> None:
    header = header_of(EXAMPLES["hello"])
    del header["sender"]["n_embd"]
    assert "hello.sender" in rejects([pack(header)], "malformed")
    rejects([pack({**header_of(EXAMPLES["heartbeat"]), "stage_id": math.nan})], "malformed")
    rejects([pack({**header_of(EXAMPLES["credit"]), "batch_id": math.nan})], "malformed")
    rejects([pack({**header_of(EXAMPLES["configure"]), "sampling": {1: 2}})], "malformed")
    rejects([pack({**header_of(EXAMPLES["credit"]), "v": "1"})], "malformed")
    rejects([pack([1, "credit"])], "malformed")


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("batch_tokens", "windows", [{"session_id": i, "pos_start": 0, "n_tokens": 1, "outputs": [], "draft": [], "head": None,
                                      **NO_CACHE_OPS} for i in range(MAX_WINDOWS + 1)]),
        ("batch_tokens", "windows", [{"session_id": 1, "pos_start": 0, "n_tokens": MAX_ROWS + 1, "outputs": [],
                                      "draft": [], "head": None, **NO_CACHE_OPS}]),
        ("release", "session_ids", list(range(MAX_SESSIONS_PER_MESSAGE + 1))),
        ("error", "session_ids", list(range(MAX_SESSIONS_PER_MESSAGE + 1))),
    ],
)
def test_oversized_counts(name: str, field: str, value: Any) -> None:
    rejects([pack({**header_of(EXAMPLES[name]), field: value})], "too_large")


def test_oversized_header() -> None:
    rejects([b"\0" * (MAX_HEADER_BYTES + 1)], "too_large")


# --- properties ---

IDS = st.integers(0, 2**63 - 1)
I31 = st.integers(0, 2**31 - 1)
TEXT = st.text(max_size=12)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
IDENTITIES = st.builds(lambda a, b, s: StageIdentity(s[0], s[1], min(a, b), max(a, b), s[2], s[3]), I31, I31,
                       st.tuples(TEXT, I31, TEXT, st.integers(1, 2**31 - 1)))
TIMINGS = st.lists(st.builds(StageTiming, TEXT, FINITE, FINITE, FINITE, FINITE), max_size=3).map(tuple)
SESSION_IDS = st.lists(IDS, max_size=5).map(tuple)


def windows_of(n: int) -> st.SearchStrategy[Window]:
    outputs = st.sets(st.integers(0, n - 1)).map(lambda s: tuple(sorted(s)))
    plain = st.builds(Window, IDS, I31, st.just(n), outputs)
    verify = st.builds(Window, IDS, I31, st.just(n), st.just(tuple(range(n))),
                       st.lists(I31, min_size=n - 1, max_size=n - 1).map(tuple)) if n > 1 else plain
    return plain | verify


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    windows = draw(st.lists(st.integers(1, 6).flatmap(windows_of), min_size=1, max_size=4,
                            unique_by=lambda w: w.session_id))
    n_rows = sum(w.n_tokens for w in windows)
    hidden = draw(st.none() | st.integers(1, 8).flatmap(
        lambda n_embd: hnp.arrays(np.float32, (n_rows, n_embd), elements=st.floats(width=32, allow_nan=False))))
    return Batch(draw(IDS), tuple(windows), hidden, draw(TIMINGS))


SAMPLINGS = st.dictionaries(TEXT, st.none() | st.booleans() | st.integers(-(2**63), 2**63) | FINITE | TEXT,
                            max_size=4).map(lambda d: {**d, "logit_bias": {1: -math.inf, 2: 0.5}})
MESSAGES: st.SearchStrategy[Message] = st.one_of(
    st.builds(Hello, IDENTITIES, TEXT),
    st.builds(Ready, IDENTITIES),
    batches(),
    st.builds(ConfigureSession, IDS, SAMPLINGS),
    st.builds(ReleaseSessions, SESSION_IDS),
    st.builds(Credit, IDS, TEXT),
    st.builds(Predictions, IDS, st.lists(st.builds(SessionPrediction, IDS, st.lists(I31, max_size=4).map(tuple)),
                                         max_size=4, unique_by=lambda r: r.session_id).map(tuple), TIMINGS),
    st.builds(ErrorReport, st.sampled_from(ErrorCode), TEXT, TEXT, st.none() | IDS, SESSION_IDS),
    st.builds(Heartbeat, TEXT),
)
WEIRD = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=4)
         | st.binary(max_size=4) | st.lists(st.integers(-2, 2), max_size=3)
         | st.dictionaries(st.text(max_size=2), st.integers(-9, 9), max_size=2))


def decodes_or_rejects(frames: list[Any], n_embd: int | None = None) -> None:
    """decode() either raises ProtocolError or returns a message that re-encodes to the same header."""
    try:
        msg = decode(frames, n_embd=n_embd)
    except ProtocolError as exc:
        assert exc.code in {"malformed", "version", "unknown_kind", "n_embd", "too_large"}
        return
    again = encode(msg)
    assert bytes(encode(decode(again))[0]) == bytes(again[0])


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_valid_messages_round_trip(msg: Message) -> None:
    assert decode(encode(msg)) == msg
    if isinstance(msg, Batch) and msg.hidden is not None:
        assert decode(encode(msg), n_embd=msg.hidden.shape[1]) == msg


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=2), st.none() | st.integers(1, 8))
def test_random_bytes_only_raise_protocol_error(frames: list[bytes], n_embd: int | None) -> None:
    decodes_or_rejects(frames, n_embd)


def locations(node: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) in a decoded header, nested ones included."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    return [loc for key, child in items for loc in [(node, key), *locations(child)]]


@settings(max_examples=300, deadline=None)
@given(MESSAGES, st.data())
def test_mutated_messages_only_raise_protocol_error(msg: Message, data: st.DataObject) -> None:
    frames: list[Any] = [bytes(f) for f in encode(msg)]
    how = data.draw(st.sampled_from(["flip", "truncate", "extend", "field", "version", "kind", "frame1"]))
    if how in ("flip", "truncate", "extend"):
        raw = bytearray(frames[0])
        at = data.draw(st.integers(0, len(raw) - 1))
        if how == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        else:
            raw = raw[:at] if how == "truncate" else raw + data.draw(st.binary(min_size=1, max_size=8))
        frames[0] = bytes(raw)
    elif how == "frame1":
        frames[1:] = data.draw(st.lists(st.binary(max_size=64).map(lambda b: b * 4), max_size=1))
    else:
        header = header_of(msg)
        if how == "field":
            container, key = data.draw(st.sampled_from(locations(header)))
            container[key] = data.draw(WEIRD)
        else:
            header["v" if how == "version" else "k"] = data.draw(WEIRD | st.sampled_from(["batch", "credit", "hello"]))
        frames[0] = pack(header)
    decodes_or_rejects(frames, data.draw(st.none() | st.integers(1, 8)))


def test_verify_window_rules() -> None:
    header = header_of(EXAMPLES["batch_tokens"])
    header["windows"][0].update(n_tokens=3, outputs=[0, 1, 2], draft=[11, 12])
    assert isinstance(decode([pack(header)]), Batch)  # a well-formed verify window
    header["windows"][0]["draft"] = [11]
    assert "a verify window of 3 rows carries n_tokens - 1 draft tokens" in rejects([pack(header)], "malformed")
    header["windows"][0].update(draft=[11, 12], outputs=[2])
    assert "and wants every row's output" in rejects([pack(header)], "malformed")
    header["windows"][0].update(draft=[11, 12], outputs=[0, 1, 2], head=7)  # a chained verify window
    batch = decode([pack(header)])
    assert isinstance(batch, Batch) and batch.windows[0].head == 7
    header["windows"][0].update(draft=[], outputs=[0, 1, 2], head=7)
    assert "n_tokens - 1 draft tokens" in rejects([pack(header)], "malformed")


def test_codes_and_reasons_decode_as_enums() -> None:
    msg = decode(encode(TokenEvents("r", (), "error", "boom", "pipeline_failed")))
    assert isinstance(msg, TokenEvents)
    assert msg.finish_reason is FinishReason.ERROR and msg.code is ErrorCode.PIPELINE_FAILED
    header = header_of(TokenEvents("r", (), "error", "boom", "pipeline_failed"))
    assert "one of" in rejects([pack({**header, "code": "teapot"})], "malformed")
    assert "one of stop, length" in rejects([pack({**header, "finish_reason": "done"})], "malformed")


def test_request_stats_are_typed_and_refused_by_field() -> None:
    stats = RequestStats(SpeculativeStats(windows=1, proposed=3, accepted=2, alpha=0.5), PrefixStats(4, True, entries=2))
    msg = decode(encode(TokenEvents("r", (), FinishReason.LENGTH, stats=stats, sent_direct=7)))
    assert isinstance(msg, TokenEvents) and (msg.stats, msg.sent_direct) == (stats, 7)
    header = header_of(TokenEvents("r", (), FinishReason.LENGTH, stats=stats))
    bad = {**header["stats"], "speculative": {**header["stats"]["speculative"], "proposed": -1}}
    assert "stats.speculative.proposed" in rejects([pack({**header, "stats": bad})], "malformed")
    bad = {**header["stats"], "prefix_cache": {**header["stats"]["prefix_cache"], "hit": 1}}
    assert "stats.prefix_cache.hit" in rejects([pack({**header, "stats": bad})], "malformed")
    assert "stats: expected map" in rejects([pack({**header, "stats": [["n", 1]]})], "malformed")
    assert "sent_direct" in rejects([pack({**header, "sent_direct": "all"})], "malformed")


def test_prefix_cache_operations_must_fit_their_window() -> None:
    window = Window(7, 64, 2, (1,), restore=PrefixRef(5, 64))
    header = header_of(Batch(1, (window,)))
    bad_restore = {**header["windows"][0], "restore": {"key": 5, "n_tokens": 60}}
    assert "restore.n_tokens" in rejects([pack({**header, "windows": [bad_restore]})], "malformed")
    bad_record = {**header["windows"][0], "record": [{"key": 6, "n_tokens": 67}]}
    assert "record" in rejects([pack({**header, "windows": [bad_record]})], "malformed")
    missing = {k: v for k, v in header["windows"][0].items() if k != "restore"}  # a peer that predates the cache
    assert "missing field(s) restore" in rejects([pack({**header, "windows": [missing]})], "malformed")


EDGE_VALUES = [-1, 0, 1, 2, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, True, False, None, 1.5, -0.5, math.nan,
               math.inf, "", "s", "f16", "error", b"x", [], [1, 1], [0, 1, 2], [[1, -0.5]], [["n", 1]], {}, {"a": 1},
               {1: 2}, {"key": 1, "n_tokens": 1}]
MORE_KINDS: list[Message] = [
    TokenEvents("r", (5, 6), FinishReason.STOP, None, None, (TokenLogprob(5, -0.5, ((5, -0.5), (7, -2))),
                                                             TokenLogprob(6, 0)),
                RequestStats(SpeculativeStats(windows=2, proposed=5, accepted=3, alpha=0.6), PrefixStats(12, True))),
    TokenEvents("r", (), FinishReason.LENGTH, stats=RequestStats(prefix_cache=PrefixStats(lookup_miss=True)), sent_direct=40),
    Submit("r", (1, 2, 3), {"temperature": 0.0}, 8, (1,)),
    Status(3, True, None, 1, 0, 4, 512), Status(4, False, "s1", 0, 2, 4, 512),
    SetWire(20.0, 100.0, WireDtype.F16), SetWire(0.0), StatusQuery(9), Cancel("r"),
    Batch(5, (Window(7, 64, 3, (0, 1, 2), (11, 12), 4, PrefixRef(5, 64), (PrefixRef(6, 67),), (3,)),),
          missed=(2,), wire_dtype=WireDtype.Q8),
]


def same_verdict(header: dict[Any, Any]) -> None:
    """The compiled decoder of `header`'s kind accepts it exactly when the schema does, decoding it the same."""
    kind = header["k"]
    seen = msgpack.unpackb(pack(header), raw=False, use_list=False, strict_map_key=False)  # as decode() sees it
    try:
        expected = codec._SCHEMAS[kind](seen, kind)
    except ProtocolError:
        with pytest.raises(Exception):  # noqa: B017, PT011 - any failure sends decode() to the schema
            codec._DECODERS[kind](seen)
        return
    assert codec._DECODERS[kind](seen) == expected
    again = encode(expected)  # the compiled encoder, and back (as bytes: a NaN in a sampling map is not == itself)
    assert bytes(encode(decode(again))[0]) == bytes(again[0])


ALL_KINDS = {**EXAMPLES, **{f"{type(m).__name__}_{i}": m for i, m in enumerate(MORE_KINDS)}}


@pytest.mark.parametrize("name", list(ALL_KINDS))
def test_compiled_decoders_accept_exactly_what_the_schemas_accept(name: str) -> None:
    """decode() tries a decoder compiled from the schema first (skippy.protocol.compiled): for every field of
    every kind, set to each edge value or dropped, it must refuse what the schema refuses and agree otherwise."""
    msg = ALL_KINDS[name]
    same_verdict(header_of(msg))
    for spot in range(len(locations(header_of(msg)))):
        for value in [*EDGE_VALUES, "drop"]:
            header = header_of(msg)
            container, key = locations(header)[spot]
            if container is header and key in ("v", "k"):
                continue
            if value != "drop":
                container[key] = value
            elif isinstance(container, dict):
                del container[key]
            else:
                container.pop(key)
            same_verdict(header)


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_compiled_decoders_agree_on_random_messages(msg: Message) -> None:
    same_verdict(header_of(msg))


def test_compiled_decoders_refuse_a_class_whose_init_does_more_than_set_fields() -> None:
    """Compiled decoders fill a message's __dict__ without calling __init__: a class with __post_init__ (or
    __slots__, which has no __dict__) is refused when the schemas are compiled, not decoded wrongly."""
    @dataclasses.dataclass(frozen=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        n: int

    for cls in (Checked, Slotted):
        with pytest.raises(TypeError, match=f"{cls.__name__}: a message class has no __post_init__ or __slots__"):
            compile_schemas({"k": _Struct(cls, n=_int())}, PROTOCOL_VERSION)
    decoders, _ = compile_schemas({"k": _Struct(Cancel, request_id=_str)}, PROTOCOL_VERSION)
    assert decoders["k"]({"request_id": "r"}) == Cancel("r")


def test_every_schema_covers_every_field_of_its_class() -> None:
    """A field missing from a schema would be dropped on the wire without a word (stats included)."""
    def structs(spec: Any) -> list[_Struct]:
        if isinstance(spec, _Struct):
            return [spec, *(s for inner in spec.specs.values() for s in structs(inner))]
        inner = getattr(spec, "inner", None) or getattr(spec, "item", None)  # an optional's or a sequence's spec
        return structs(inner) if inner is not None else []

    seen = [s for schema in codec._SCHEMAS.values() for s in structs(schema)]
    assert {s.cls for s in seen} >= {SpeculativeStats, PrefixStats, RequestStats}
    for schema in seen:
        header_fields = {f.name for f in dataclasses.fields(schema.cls) if not f.metadata.get("frame")}
        assert set(schema.specs) == header_fields, schema.cls
