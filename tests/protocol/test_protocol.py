"""skippy.protocol: every message round-trips, and decode() rejects anything else with ProtocolError only."""

from __future__ import annotations

import math
from typing import Any, get_args

import msgpack
import msgspec
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
    EventBatch,
    FinishReason,
    Heartbeat,
    Hello,
    KeptPrefix,
    Message,
    Predictions,
    PrefixRef,
    PromptProgress,
    ProtocolError,
    Ready,
    ReleaseSessions,
    ResumePoint,
    SessionPrediction,
    SetWire,
    StageIdentity,
    StagePrefillRate,
    StageTiming,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
    TokenLogprob,
    Window,
    WireDtype,
    WireVerdict,
    decode,
    encode,
)
from skippy.protocol.base import MAX_CONTEXT_TOKENS
from skippy.protocol.stats import PrefixStats, RequestStats, SpeculativeStats

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
    "ready_cache": Ready(IDENTITY, CacheCaps(4096, 16, 18432, False)),
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


def test_a_header_without_a_version_is_refused() -> None:
    """A message's `v` defaults in code, never on the wire: every header must say its version."""
    header = {k: v for k, v in header_of(EXAMPLES["credit"]).items() if k != "v"}
    assert "missing field(s) v" in rejects([pack(header)], "malformed")


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


def test_a_prompt_or_history_may_fill_a_whole_context() -> None:
    """Past one batch's rows (an agent client's first prompt alone can be), up to MAX_CONTEXT_TOKENS."""
    long = tuple(range(MAX_ROWS + 1))
    for msg in (Submit("r", long, {}, 8), Submit("r", (1,), {}, 8, resume_from=ResumePoint(long)),
                ConfigureSession(7, {}, long)):
        assert decode(encode(msg)) == msg
    message = rejects([pack({**header_of(Submit("r", (1,), {}, 8)), "prompt": [1] * (MAX_CONTEXT_TOKENS + 1)})],
                      "too_large")
    assert message.startswith(f"submit.prompt: expected at most {MAX_CONTEXT_TOKENS} items"), message


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
    missing = {k: v for k, v in header["windows"][0].items() if k != "restore"}  # a field with a default takes it
    batch = decode([pack({**header, "windows": [missing]})])  # (a peer that predates the cache is refused by its v)
    assert isinstance(batch, Batch) and batch.windows[0].restore is None
    missing = {k: v for k, v in header["windows"][0].items() if k != "n_tokens"}  # one without is refused
    assert rejects([pack({**header, "windows": [missing]})], "malformed") == "batch.windows[0]: missing field(s) n_tokens"


EDGE_VALUES = [-1, 0, 1, 2, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, True, False, None, 1.5, -0.5, math.nan,
               math.inf, "", "s", "f16", "error", b"x", [], [1, 1], [0, 1, 2], [[1, -0.5]], [["n", 1]], {}, {"a": 1},
               {1: 2}, {"key": 1, "n_tokens": 1}]
MORE_KINDS: list[Message] = [
    TokenEvents("r", (5, 6), FinishReason.STOP, None, None, (TokenLogprob(5, -0.5, ((5, -0.5), (7, -2))),
                                                             TokenLogprob(6, 0)),
                RequestStats(SpeculativeStats(windows=2, proposed=5, accepted=3, alpha=0.6), PrefixStats(12, True))),
    TokenEvents("r", (), FinishReason.LENGTH, stats=RequestStats(prefix_cache=PrefixStats(lookup_miss=True)), sent_direct=40),
    Submit("r", (1, 2, 3), {"temperature": 0.0}, 8, (1,)),
    Submit("r", (1, 2, 3), {}, 8, resume_from=ResumePoint((4, 5), (2,), 3)),
    Status(3, True, None, 1, 0, 4, 512), Status(4, False, "s1", 0, 2, 4, 512),
    SetWire(20.0, 100.0, WireDtype.F16), SetWire(0.0), StatusQuery(9), Cancel("r"),
    Batch(5, (Window(7, 64, 3, (0, 1, 2), (11, 12), 4, PrefixRef(5, 64), (PrefixRef(6, 67),), (3,)),),
          missed=(2,), wire_dtype=WireDtype.Q8),
]


ALL_KINDS = {**EXAMPLES, **{f"{type(m).__name__}_{i}": m for i, m in enumerate(MORE_KINDS)}}




@pytest.mark.parametrize("name", list(ALL_KINDS))
def test_every_field_at_every_edge_value_decodes_or_is_refused_by_path(name: str) -> None:
    """For every field of every kind, set to each edge value or dropped: decode() accepts it (and the message
    re-encodes to itself) or refuses it with ProtocolError only, naming a field of that kind."""
    msg = ALL_KINDS[name]
    kind = header_of(msg)["k"]
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
            try:
                decode([pack(header)])
            except ProtocolError as exc:
                assert exc.code in {"malformed", "too_large"} and exc.message.startswith(kind), exc
                assert "\n" not in exc.message
            decodes_or_rejects([pack(header)])


F16_EXACT = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
EVERY_FIELD: list[Message] = [
    Hello(IDENTITY, "tcp://127.0.0.1:5555"),
    Ready(IDENTITY, CacheCaps(4096, 16, 18432, False)),
    Batch(5, (Window(7, 64, 3, (0, 1, 2), (11, 12), 4, PrefixRef(5, 64), (PrefixRef(6, 67),), (3,),
                     input_tokens=(4, 11, 12), mtp_draft_max=2),), F16_EXACT,
          (TIMING,), WireDtype.F16, (2,)),
    ConfigureSession(7, SAMPLING, (11, 12), 3),
    ReleaseSessions((7, 9), (KeptPrefix(7, PrefixRef(5, 66)),), (3, 4)),
    Credit(2, "s1"),
    Predictions(2, (SessionPrediction(7, (11,), (TokenLogprob(11, -0.5, ((11, -0.5), (12, -1.5))),), 4,
                                      mtp_draft=(13, 14)),), (TIMING,), (9,),
                True),
    ErrorReport(ErrorCode.BATCH_FAILED, "boom", "s1", 2, (7, 9)),
    Heartbeat("s1", "incarnation-1"),
    SetWire(20.0, 100.0, WireDtype.Q8, True),
    Submit("r", (1, 2, 3), {"temperature": 0.5}, 8, (1,), "ipc:///tmp/events",
           resume_from=ResumePoint((4, 5), (2, 3), 2), progress=True),
    Cancel("r", "ipc:///tmp/events", abandoned=True),
    TokenEvents("r", (5,), FinishReason.ERROR, "boom", ErrorCode.PIPELINE_FAILED, (TokenLogprob(5, -0.5, ((5, -0.5),)),),
                RequestStats(SpeculativeStats(*range(1, 9), 0.5, *range(9, 14), 2.5, 15, 16, (17, 18)),
                             PrefixStats(1, True, True, 2, 3, 4, 5)), 6, draws=3, chunk_ends=(2, 3),
                progress=PromptProgress(10, 2, 5, 1.5, (StagePrefillRate("s0", 120.5),))),
    EventBatch((TokenEvents("a", (5, 6), FinishReason.STOP, "x", ErrorCode.PIPELINE_FAILED,
                            (TokenLogprob(5, -0.5, ((5, -0.5),)),),
                            RequestStats(SpeculativeStats(*range(1, 9), 0.5, *range(9, 14), 2.5, 15, 16, (17, 18)),
                                         PrefixStats(1, True, True, 2, 3, 4, 5)), 6, draws=3, chunk_ends=(2, 3),
                            progress=PromptProgress(10, 2, 5, 1.5, (StagePrefillRate("s0", 120.5),))),)),
    StatusQuery(9),
    Status(3, True, "s1", 1, 2, 4, 512, WireVerdict("auto", WireDtype.F16, ((WireDtype.Q8, 0.5), (WireDtype.F16, 1.0)), 22,
                                                    False)),
]


def unset_fields(obj: Any, path: str) -> list[str]:
    """The fields of `obj`, nested structs' too, that are at their default (`v` aside: it always is)."""
    if isinstance(obj, tuple):
        return [f for i, item in enumerate(obj) for f in unset_fields(item, f"{path}[{i}]")]
    if not isinstance(obj, msgspec.Struct):
        return []
    found = []
    for f in msgspec.structs.fields(obj):
        value = getattr(obj, f.name)
        default = f.default if f.default_factory is msgspec.NODEFAULT else f.default_factory()
        if f.name != "v" and default is not msgspec.NODEFAULT and (value is default or (
                not isinstance(value, np.ndarray) and value == default)):
            found.append(f"{path}.{f.name}")
        found += unset_fields(value, f"{path}.{f.name}")
    return found


def test_every_field_of_every_kind_round_trips() -> None:
    """A field the codec left out of the header would be dropped on the wire without a word (a batch's header
    is written apart from its hidden): every kind, each field set off its default, nested ones and stats too."""
    assert {type(m) for m in EVERY_FIELD} == set(get_args(Message))
    for msg in EVERY_FIELD:
        assert unset_fields(msg, type(msg).__name__) == []
        n_embd = msg.hidden.shape[1] if isinstance(msg, Batch) else None
        assert decode(encode(msg), n_embd=n_embd) == msg
        fields = {f.encode_name for f in msgspec.structs.fields(msg)} - {"hidden"}
        assert set(header_of(msg)) == fields | {"k"}
