"""Encoding and validation of protocol messages: msgpack header frame plus, for a batch, its activations.

`decode` validates everything it returns and raises only ProtocolError, so a process can answer a
bad peer and keep serving. How the activations are packed (f32, f16, q8) is in `activations`.
Each kind's schema is compiled into a flat decoder and encoder (`compiled`); the schema itself runs
only to say which field of a refused message is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from skippy.protocol.activations import pack, unpack
from skippy.protocol.compiled import compile_schemas
from skippy.protocol.messages import (
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
    KeptPrefix,
    Message,
    MessageKind,
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
)
from skippy.protocol.specs import (  # noqa: F401 - the schema building blocks
    Spec,
    _atom,
    _enum,
    _fail,
    _float,
    _int,
    _opt,
    _seq,
    _show,
    _str,
    _str_keyed_map,
    _Struct,
)
from skippy.protocol.stats import PrefixStats, RequestStats, SpeculativeStats

if TYPE_CHECKING:
    import zmq

# 2: Window.tokens, StageTiming.send_ms, Heartbeat.stage_index/sent_at gone
# 3: prefix cache (Window.restore/record/evict, Batch/Predictions.missed, Ready.cache, ReleaseSessions.keep/evict):
#    a peer that ignored a restore would compute on an empty KV, so older peers are refused
# 4: Predictions.credit (an older stage 0 would never get that credit back)
# 5: TokenEvents.stats typed (RequestStats), TokenEvents.sent_direct
PROTOCOL_VERSION: int = 5
MAX_HEADER_BYTES = 1 << 20
MAX_WINDOWS = 1024
MAX_ROWS = 16384
MAX_SESSIONS_PER_MESSAGE = 1024
_MAX_TIMINGS = 256
_U63 = 2**63 - 1
_I31 = 2**31 - 1  # llama.cpp positions and token ids are int32
_F32 = np.dtype("<f4")




def _check_identity(s: StageIdentity, path: str | None) -> None:
    if s.layer_end < s.layer_start:
        raise _fail(f"{path}.layer_end", f"int >= layer_start {s.layer_start}", s.layer_end)


def _check_window(w: Window, path: str | None) -> None:
    out = w.outputs
    if out and (out[-1] >= w.n_tokens or any(a >= b for a, b in zip(out, out[1:]))):
        raise _fail(f"{path}.outputs", f"strictly increasing offsets in [0, {w.n_tokens})", list(out))
    if (w.draft or w.head is not None) and (len(w.draft) != w.n_tokens - 1 or out != tuple(range(w.n_tokens))):
        raise ProtocolError(ErrorCode.MALFORMED, f"{path}.draft: a verify window of {w.n_tokens} rows carries"
                            f" n_tokens - 1 draft tokens and wants every row's output, got {len(w.draft)} draft"
                            f" tokens and outputs {list(out)}")
    if w.restore is not None and w.restore.n_tokens != w.pos_start:
        raise _fail(f"{path}.restore.n_tokens", f"the window's pos_start {w.pos_start}", w.restore.n_tokens)
    end = w.pos_start + w.n_tokens
    if any(r.n_tokens > end for r in w.record):
        raise _fail(f"{path}.record", f"entries of at most the window's end {end} tokens", [r.n_tokens for r in w.record])


def _check_unique(path: str | None, items: str, ids: Sequence[int]) -> None:
    seen: set[int] = set()
    for i, sid in enumerate(ids):
        if sid in seen:
            raise ProtocolError(ErrorCode.MALFORMED, f"{path}.{items}[{i}].session_id: duplicate session {sid}")
        seen.add(sid)


def _check_batch(b: Batch, path: str | None) -> None:
    if not b.windows:
        raise ProtocolError(ErrorCode.MALFORMED, f"{path}.windows: expected at least one window, got none")
    if b.n_rows > MAX_ROWS:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{path}: expected at most {MAX_ROWS} rows, got {b.n_rows}")
    _check_unique(path, "windows", [w.session_id for w in b.windows])


def _check_predictions(p: Predictions, path: str | None) -> None:
    _check_unique(path, "results", [r.session_id for r in p.results])


_BOOL = _atom("bool", lambda v: type(v) is bool, "type({v}) is bool")
_SESSION = _int()
_TOKENS = _seq(_int(0, _I31), MAX_ROWS)
_SESSIONS = _seq(_SESSION, MAX_SESSIONS_PER_MESSAGE)
_IDENTITY = _Struct(StageIdentity, _check_identity, stage_id=_str, stage_index=_int(0, _I31),
                    layer_start=_int(0, _I31), layer_end=_int(0, _I31), model_digest=_str, n_embd=_int(1, _I31))
_TIMING = _Struct(StageTiming, stage_id=_str, recv_at=_float, compute_ms=_float, credit_wait_ms=_float,
                  sent_at=_float)
_TIMINGS = _seq(_TIMING, _MAX_TIMINGS)
_PREFIX = _Struct(PrefixRef, key=_int(), n_tokens=_int(1, _I31))
_KEYS = _seq(_int(), MAX_SESSIONS_PER_MESSAGE)
_WINDOW = _Struct(Window, _check_window, session_id=_SESSION, pos_start=_int(0, _I31), n_tokens=_int(1),
                  outputs=_seq(_int(), MAX_ROWS), draft=_TOKENS, head=_opt(_int(0, _I31)), restore=_opt(_PREFIX),
                  record=_seq(_PREFIX, 64), evict=_KEYS)
_CAPS = _Struct(CacheCaps, cells=_int(), entries=_int(), cell_bytes=_int())
_KEPT = _Struct(KeptPrefix, session_id=_SESSION, ref=_PREFIX)
_PAIR = _atom("[token, logprob] pair", lambda v: type(v) is tuple and len(v) == 2 and type(v[0]) is int
              and 0 <= v[0] <= _I31 and (type(v[1]) is float or type(v[1]) is int))
_NUMBER = _atom("number", lambda v: type(v) in (int, float), "type({v}) in (int, float)")
_LOGPROB = _Struct(TokenLogprob, token=_int(0, _I31), logprob=_NUMBER,
                   top=_seq(_PAIR, 64))
_LOGPROBS = _seq(_LOGPROB, MAX_ROWS)
_COUNT = _int()
_SPECULATIVE = _Struct(SpeculativeStats, windows=_COUNT, proposed=_COUNT, accepted=_COUNT, full_accepts=_COUNT,
                       early_rejects=_COUNT, tail_rejects=_COUNT, stops=_COUNT, wasted_rows=_COUNT, alpha=_float,
                       k_start=_COUNT, k_last=_COUNT, k_min=_COUNT, k_max=_COUNT, proposer_calls=_COUNT,
                       proposer_us_per_call=_float, stale_windows=_COUNT, stale_rows=_COUNT)
_PREFIX_STATS = _Struct(PrefixStats, cached_tokens=_COUNT, hit=_BOOL, lookup_miss=_BOOL, chain_misses=_COUNT,
                        evictions=_COUNT, entries=_COUNT, bytes=_COUNT)
_STATS = _Struct(RequestStats, speculative=_opt(_SPECULATIVE), prefix_cache=_opt(_PREFIX_STATS))
_RESULT = _Struct(SessionPrediction, session_id=_SESSION, tokens=_TOKENS, logprobs=_LOGPROBS)

_SCHEMAS: dict[MessageKind, _Struct] = {
    MessageKind.HELLO: _Struct(Hello, sender=_IDENTITY, reply_endpoint=_str),
    MessageKind.READY: _Struct(Ready, sender=_IDENTITY, cache=_opt(_CAPS)),
    MessageKind.BATCH: _Struct(Batch, _check_batch, batch_id=_int(), windows=_seq(_WINDOW, MAX_WINDOWS), timings=_TIMINGS,
                               wire_dtype=_enum(WireDtype), missed=_SESSIONS, optional=("wire_dtype",)),
    MessageKind.CONFIGURE: _Struct(ConfigureSession, session_id=_SESSION, sampling=_str_keyed_map),
    MessageKind.RELEASE: _Struct(ReleaseSessions, session_ids=_SESSIONS, keep=_seq(_KEPT, MAX_SESSIONS_PER_MESSAGE),
                                 evict=_KEYS),
    MessageKind.CREDIT: _Struct(Credit, batch_id=_int(), stage_id=_str),
    MessageKind.PREDICTIONS: _Struct(Predictions, _check_predictions, batch_id=_int(),
                           results=_seq(_RESULT, MAX_SESSIONS_PER_MESSAGE), timings=_TIMINGS, missed=_SESSIONS,
                           credit=_BOOL),
    MessageKind.ERROR: _Struct(ErrorReport, code=_enum(ErrorCode), message=_str, stage_id=_str, batch_id=_opt(_int()),
                               session_ids=_SESSIONS),
    MessageKind.HEARTBEAT: _Struct(Heartbeat, stage_id=_str, incarnation=_str, optional=("incarnation",)),
    MessageKind.WIRE: _Struct(SetWire, delay_ms=_float, mbps=_opt(_float), activation_dtype=_opt(_enum(WireDtype)),
                              optional=("activation_dtype",)),
    MessageKind.SUBMIT: _Struct(Submit, request_id=_str, prompt=_TOKENS, sampling=_str_keyed_map, max_tokens=_int(1, _I31),
                      stop_tokens=_seq(_int(0, _I31), MAX_ROWS), events_to=_opt(_str), optional=("events_to",)),
    MessageKind.CANCEL: _Struct(Cancel, request_id=_str),
    MessageKind.TOKENS: _Struct(TokenEvents, request_id=_str, tokens=_TOKENS, finish_reason=_opt(_enum(FinishReason)),
                      error=_opt(_str), code=_opt(_enum(ErrorCode)), logprobs=_LOGPROBS, stats=_opt(_STATS),
                      sent_direct=_opt(_int())),
    MessageKind.STATUS_QUERY: _Struct(StatusQuery, nonce=_int()),
    MessageKind.STATUS: _Struct(Status, nonce=_int(), ready=_BOOL, dead_stage=_opt(_str),
                      running=_int(), waiting=_int(), lane_count=_int(), ctx_size=_int()),
}
_KIND_OF: dict[type, MessageKind] = {schema.cls: kind for kind, schema in _SCHEMAS.items()}
_DECODERS, _ENCODERS = compile_schemas(_SCHEMAS, PROTOCOL_VERSION)  # the schemas' checks inline, no field paths
_VERSION = _int()

# --- encode / decode ---


def _numpy_scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot put {type(value).__name__} on the wire")


def encode(msg: Message) -> list[bytes | memoryview]:
    """Frames for ``msg``; a batch's activations go packed as its ``wire_dtype`` says (f32: a zero-copy
    view of a '<f4' C array).

    Raises TypeError for a non-message and ValueError for a message no peer would accept
    (hidden of the wrong shape, header over MAX_HEADER_BYTES).
    """
    encoder = _ENCODERS.get(type(msg))
    if encoder is None:
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    header = msgpack.packb(encoder(msg), use_bin_type=True, default=_numpy_scalar)
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"{_KIND_OF[type(msg)]} header is {len(header)} bytes, over MAX_HEADER_BYTES {MAX_HEADER_BYTES}")
    frames: list[bytes | memoryview] = [header]
    if isinstance(msg, Batch) and msg.hidden is not None:
        hidden = np.ascontiguousarray(msg.hidden, dtype=_F32)  # no copy when already '<f4' C order
        if hidden.ndim != 2 or hidden.shape[0] != msg.n_rows or hidden.shape[1] < 1:
            raise ValueError(f"batch {msg.batch_id}: hidden has shape {hidden.shape}, expected ({msg.n_rows}, n_embd)")
        frames.append(pack(hidden, msg.wire_dtype))
    return frames


def _view(frame: Any, index: int) -> memoryview:
    try:
        return memoryview(frame).cast("B")
    except (TypeError, ValueError, BufferError):
        raise ProtocolError(ErrorCode.MALFORMED, f"frame {index}: expected a byte buffer, got {type(frame).__name__}") from None


def _unpack_header(frame: Any) -> dict[Any, Any]:
    view = _view(frame, 0)
    if view.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"header: {view.nbytes} bytes, over the {MAX_HEADER_BYTES} limit")
    try:
        header = msgpack.unpackb(view, raw=False, use_list=False, strict_map_key=False)
    except Exception as exc:  # msgpack's failure types are many and unspecified
        raise ProtocolError(ErrorCode.MALFORMED, f"header: not valid msgpack ({type(exc).__name__})") from None
    if type(header) is not dict:
        raise _fail("header", "map", header)
    return header


def _attach_hidden(batch: Batch, frame: Any, n_embd: int | None) -> Batch:
    if frame is None:
        if n_embd is not None:
            raise ProtocolError(ErrorCode.N_EMBD, f"batch: expected {batch.n_rows} rows x n_embd {n_embd}"
                                                  f" {batch.wire_dtype}, got no activation frame")
        return batch
    # the batch was made here and is not shared yet: set its field rather than copy it (dataclasses.replace)
    object.__setattr__(batch, "hidden", unpack(_view(frame, 1), batch.n_rows, n_embd, batch.wire_dtype))
    return batch


def decode(frames: Sequence[bytes | memoryview | zmq.Frame], *, n_embd: int | None = None) -> Message:
    """The message in ``frames``, fully validated; raises only ProtocolError.

    With ``n_embd`` (a stage that expects activations) a batch must carry exactly ``n_rows`` rows
    of ``n_embd`` in its ``wire_dtype``; without it (stage 0) the width is taken from the frame.
    The decoded ``hidden`` is read-only float32: for f32 a view onto frame 1, not a copy.
    """
    if not isinstance(frames, Sequence) or not 1 <= len(frames) <= 2:
        raise _fail("message", "1 or 2 frames", len(frames) if isinstance(frames, Sequence) else frames)
    header = _unpack_header(frames[0])
    version = _VERSION(header.get("v"), "header.v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.VERSION, f"peer speaks protocol version {version}, this build speaks {PROTOCOL_VERSION}")
    kind = _str(header.get("k"), "header.k")
    schema = _SCHEMAS.get(kind)
    if schema is None:
        known = ", ".join(_SCHEMAS)
        raise ProtocolError(ErrorCode.UNKNOWN_KIND, f"header.k: unknown message kind {kind[:60]!r} (known: {known})")
    try:
        msg = _DECODERS[kind](header)
    except Exception:  # noqa: BLE001 - anything: the schema, with field paths, says what is wrong
        msg = schema(header, kind)
    if isinstance(msg, Batch):
        return _attach_hidden(msg, frames[1] if len(frames) == 2 else None, n_embd)
    if len(frames) == 2:
        raise ProtocolError(ErrorCode.MALFORMED, f"{kind}: unexpected frame 1; only a batch carries activations")
    return msg
