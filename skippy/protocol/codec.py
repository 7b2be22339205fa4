"""Encoding and validation of protocol messages: msgpack header frame plus, for a batch, its activations.

The header is encoded and decoded by msgspec against the message Structs (`skippy.protocol.messages`):
one module-level Encoder, and one Decoder of the tagged union of every kind (on ``k``, the version
a ``Literal`` on ``v``), so a decode is one C call that checks every field's type and value rule,
then the few rules across fields that a type cannot say (`_check_batch` and its kin below). A
refused header is looked at again, slowly, to say why in skippy's words: the ErrorCode (a wrong
version or an unknown kind before anything else, an over-long array ``too_large``) and the field's
path, ``batch.windows[2].n_tokens: expected int >= 1, got -3``.

Every field is always written; a missing field with a default takes it, except ``v``: every header
must carry its version (checked first, by a decode that reads only ``v``); unknown keys are
ignored, except ``hidden`` on a batch, which may only be nil (activations travel in frame 1).
`decode` raises only ProtocolError, so a process can answer a bad peer and keep serving.
How the activations are packed (f32, f16, q8) is in `activations`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import msgspec.inspect as mi
import numpy as np

from skippy.protocol.activations import pack, unpack
from skippy.protocol.messages import (
    MAX_HEADER_BYTES,
    MAX_ROWS,
    MAX_SESSIONS_PER_MESSAGE,
    MAX_WINDOWS,
    PROTOCOL_VERSION,
    Batch,
    ErrorCode,
    Hello,
    Message,
    Predictions,
    ProtocolError,
    Ready,
    StageIdentity,
    Window,
    _Message,
)

if TYPE_CHECKING:
    import zmq

__all__ = ["MAX_HEADER_BYTES", "MAX_ROWS", "MAX_SESSIONS_PER_MESSAGE", "MAX_WINDOWS", "PROTOCOL_VERSION", "decode",
           "encode"]

_F32 = np.dtype("<f4")
_U63 = 2**63 - 1
_KINDS: dict[str, type[Any]] = {cls.__struct_config__.tag: cls for cls in Message.__args__}
_KIND_OF: dict[type, str] = {cls: kind for kind, cls in _KINDS.items()}

# A batch's header: its fields but `hidden` (which travels as frame 1), as msgspec writes them.
_BatchHeader = msgspec.defstruct(
    "_BatchHeader", [(f.name, f.type) for f in msgspec.structs.fields(Batch) if f.name not in ("hidden", "v")],
    bases=(_Message,), tag=_KIND_OF[Batch], frozen=True)


def _numpy_scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot put {type(value).__name__} on the wire")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_numpy_scalar)
_DECODER = msgspec.msgpack.Decoder(Message)
_ANY = msgspec.msgpack.Decoder()  # a refused header, as plain values (to say what is wrong with it)


class _Version(msgspec.Struct):
    """Every header's `v`, required: a message's own `v` defaults (so code never passes it), the wire's does not."""

    v: int


_VERSION = msgspec.msgpack.Decoder(_Version)  # skips the other fields in C: a fraction of a message's decode


# --- what the types cannot say ---


def _show(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if type(value) in (int, float) else f"{type(value).__name__} {text}"


def _fail(path: str, expected: str, value: Any) -> ProtocolError:
    return ProtocolError(ErrorCode.MALFORMED, f"{path}: expected {expected}, got {_show(value)}")


def _check_identity(s: StageIdentity, path: str) -> None:
    if s.layer_end < s.layer_start:
        raise _fail(f"{path}.layer_end", f"int >= layer_start {s.layer_start}", s.layer_end)


def _check_hello(msg: Hello | Ready) -> None:
    _check_identity(msg.sender, f"{_KIND_OF[type(msg)]}.sender")


def _check_window(w: Window, i: int) -> None:
    """Window ``i`` of a batch: outputs strictly increasing in [0, n_tokens); a verify window (draft or head)
    of n rows carries n - 1 draft tokens and wants every row's output; a restore is of pos_start positions,
    a record at most the window's end."""
    out = w.outputs
    if out and (out[-1] >= w.n_tokens or any(a >= b for a, b in zip(out, out[1:]))):
        raise _fail(f"batch.windows[{i}].outputs", f"strictly increasing offsets in [0, {w.n_tokens})", list(out))
    if (w.draft or w.head is not None) and (len(w.draft) != w.n_tokens - 1 or out != tuple(range(w.n_tokens))):
        raise ProtocolError(ErrorCode.MALFORMED, f"batch.windows[{i}].draft: a verify window of {w.n_tokens} rows"
                            f" carries n_tokens - 1 draft tokens and wants every row's output, got {len(w.draft)}"
                            f" draft tokens and outputs {list(out)}")
    if w.restore is not None and w.restore.n_tokens != w.pos_start:
        raise _fail(f"batch.windows[{i}].restore.n_tokens", f"the window's pos_start {w.pos_start}", w.restore.n_tokens)
    end = w.pos_start + w.n_tokens
    if any(r.n_tokens > end for r in w.record):
        raise _fail(f"batch.windows[{i}].record", f"entries of at most the window's end {end} tokens",
                    [r.n_tokens for r in w.record])


def _refuse_duplicate(path: str, ids: Sequence[int]) -> None:
    seen: set[int] = set()
    for i, sid in enumerate(ids):
        if sid in seen:
            raise ProtocolError(ErrorCode.MALFORMED, f"{path}[{i}].session_id: duplicate session {sid}")
        seen.add(sid)


def _check_batch(b: Batch) -> None:
    """Every window by `_check_window`, at most MAX_ROWS rows, one window per session.

    A plain decode or prefill window (at most one output, nothing else) is seen to pass inline: a batch of
    64 decode windows is checked on every step, and a cold call costs more than the checks."""
    windows = b.windows
    rows = 0
    for i, w in enumerate(windows):
        n = w.n_tokens
        rows += n
        out = w.outputs
        if len(out) > 1 or (out and out[0] >= n) or w.draft or w.head is not None or w.restore is not None or w.record:
            _check_window(w, i)
    if rows > MAX_ROWS:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"batch: expected at most {MAX_ROWS} rows, got {rows}")
    if len(windows) > 1 and len({w.session_id for w in windows}) != len(windows):
        _refuse_duplicate("batch.windows", [w.session_id for w in windows])


def _check_predictions(p: Predictions) -> None:
    if len({r.session_id for r in p.results}) != len(p.results):
        _refuse_duplicate("predictions.results", [r.session_id for r in p.results])


_CHECKS: dict[type, Any] = {Hello: _check_hello, Ready: _check_hello, Predictions: _check_predictions}


# --- a refused header, in skippy's words ---

_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def _expected(t: mi.Type) -> str:
    """What a value of msgspec type `t` must be, as a refusal says it."""
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else None if t.gt is None else t.gt + 1
        hi = t.le if t.le is not None else None if t.lt is None else t.lt - 1
        return "int" if lo is None else f"int >= {lo}" if hi in (None, _U63) else f"int in [{lo}, {hi}]"
    if isinstance(t, mi.FloatType):
        return "number" if t.ge is None and t.gt is None else "finite number"
    if isinstance(t, mi.UnionType):
        parts = [_expected(m) for m in t.types if not isinstance(m, mi.NoneType)]
        nil = len(parts) < len(t.types) and not any(p.startswith("nil") for p in parts)
        return " or ".join(parts + ["nil"] * nil)
    if isinstance(t, mi.EnumType | mi.LiteralType):
        values = [m.value for m in t.cls] if isinstance(t, mi.EnumType) else list(t.values)
        return f"one of {', '.join(map(str, values))}"
    if isinstance(t, mi.DictType):
        return f"map with {_expected(t.key_type)} keys"
    if isinstance(t, mi.TupleType):
        return f"[{', '.join(_expected(i) for i in t.item_types)}] array"
    if isinstance(t, mi.CustomType):  # Batch.hidden
        return "nil (activations travel in frame 1)"
    names = {mi.StrType: "str", mi.BoolType: "bool", mi.NoneType: "nil", mi.StructType: "map", mi.AnyType: "any value"}
    return names.get(type(t), "array" if isinstance(t, mi.VarTupleType | mi.ListType) else type(t).__name__)


def _child(t: mi.Type | None, name: str | None) -> mi.Type | None:
    """The type of field `name` (an index when None) of a value of type `t`."""
    for member in t.types if isinstance(t, mi.UnionType) else (t,):
        if name is not None and isinstance(member, mi.StructType):
            return next((f.type for f in member.fields if f.encode_name == name), None)
        if name is None and isinstance(member, mi.VarTupleType | mi.ListType):
            return member.item_type
    return None


_TYPE_INFO: dict[str, mi.Type] = {}  # per kind, made on its first refusal


def _type_info(kind: str) -> mi.Type:
    if kind not in _TYPE_INFO:
        _TYPE_INFO[kind] = mi.type_info(_KINDS[kind])
    return _TYPE_INFO[kind]


def _explain(kind: str, raw: dict[Any, Any], error: str) -> ProtocolError:
    """The ProtocolError for msgspec's ValidationError `error` on the header `raw` of a `kind` message."""
    text, at, where = error.rpartition(" - at `")
    text = text if at else error
    in_key = where.startswith("key` in `")
    spot = where.removeprefix("key` in `").removesuffix("`") if at else "$"
    t: mi.Type | None = _type_info(kind)
    value: Any = raw
    for match in _SEGMENT.finditer(spot):
        name, index = match.groups()
        if index is not None and t is not None and isinstance(t, mi.TupleType):
            t = t.item_types[int(index)] if int(index) < len(t.item_types) else None
        else:
            t = _child(t, name)
        value = value.get(name) if name is not None and isinstance(value, dict) else (
            value[int(index)] if index is not None and isinstance(value, list) and int(index) < len(value) else None)
    path = kind + spot[1:]
    if text.startswith("Object missing required field"):
        fields = t.fields if isinstance(t, mi.StructType) and isinstance(value, dict) else ()
        missing = [f.encode_name for f in fields if f.required and f.encode_name not in value] or [text.split("`")[1]]
        return ProtocolError(ErrorCode.MALFORMED, f"{path}: missing field(s) {', '.join(missing)}")
    longest = re.match(r"Expected `\w+` of length <= (\d+)", text)
    if longest is not None and hasattr(value, "__len__"):
        return ProtocolError(ErrorCode.TOO_LARGE, f"{path}: expected at most {longest[1]} items, got {len(value)}")
    shortest = re.match(r"Expected `\w+` of length >= (\d+)", text)
    if shortest is not None and hasattr(value, "__len__"):
        n = int(shortest[1])
        return ProtocolError(ErrorCode.MALFORMED, f"{path}: expected at least {n} item{'s' * (n != 1)}, got {len(value)}")
    if t is None or in_key and not isinstance(t, mi.DictType):
        return ProtocolError(ErrorCode.MALFORMED, f"{path}: {text[:1].lower()}{text[1:].replace('`', '')}")
    return _fail(path, _expected(t), value)


def _refusal(view: memoryview, exc: Exception) -> ProtocolError:
    """The ProtocolError for a header the Decoder refused with `exc`: which rule, said as skippy says it.
    In the old order: msgpack, a map, the version, the kind, then the fields."""
    try:
        raw = _ANY.decode(view)
    except Exception as again:  # noqa: BLE001 - not msgpack at all (msgspec's DecodeError, or too deep)
        reason = str(again).removeprefix("MessagePack data is malformed: ") or type(again).__name__
        return ProtocolError(ErrorCode.MALFORMED, f"header: not valid msgpack ({reason[:100]})")
    if type(raw) is not dict:
        return _fail("header", "map", raw)
    if "v" not in raw:
        return ProtocolError(ErrorCode.MALFORMED, "header: missing field(s) v (the protocol version)")
    version = raw["v"]
    if type(version) is not int or not 0 <= version <= _U63:
        return _fail("header.v", "int >= 0", version)
    if version != PROTOCOL_VERSION:
        return ProtocolError(ErrorCode.VERSION, f"peer speaks protocol version {version}, this build speaks {PROTOCOL_VERSION}")
    kind = raw.get("k")
    if type(kind) is not str:
        return _fail("header.k", "str", kind)
    if kind not in _KINDS:
        known = ", ".join(_KINDS)
        return ProtocolError(ErrorCode.UNKNOWN_KIND, f"header.k: unknown message kind {kind[:60]!r} (known: {known})")
    if not isinstance(exc, msgspec.ValidationError):
        return ProtocolError(ErrorCode.MALFORMED, f"{kind}: {str(exc)[:200]}")
    return _explain(kind, raw, str(exc))


# --- encode / decode ---


def encode(msg: Message) -> list[bytes | memoryview]:
    """Frames for ``msg``; a batch's activations go packed as its ``wire_dtype`` says (f32: a zero-copy
    view of a '<f4' C array).

    Raises TypeError for a non-message and ValueError for a message no peer would accept
    (hidden of the wrong shape, header over MAX_HEADER_BYTES).
    """
    if isinstance(msg, Batch):
        header = _ENCODER.encode(_BatchHeader(msg.batch_id, msg.windows, msg.timings, msg.wire_dtype, msg.missed))
    elif type(msg) in _KIND_OF:
        header = _ENCODER.encode(msg)
    else:
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
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


def _attach_hidden(batch: Batch, frame: Any, n_embd: int | None) -> Batch:
    if frame is None:
        if n_embd is not None:
            raise ProtocolError(ErrorCode.N_EMBD, f"batch: expected {batch.n_rows} rows x n_embd {n_embd}"
                                                  f" {batch.wire_dtype}, got no activation frame")
        return batch
    # the batch was made here and is not shared yet: set its field rather than copy it (msgspec.structs.replace)
    msgspec.structs.force_setattr(batch, "hidden", unpack(_view(frame, 1), batch.n_rows, n_embd, batch.wire_dtype))
    return batch


def decode(frames: Sequence[bytes | memoryview | zmq.Frame], *, n_embd: int | None = None) -> Message:
    """The message in ``frames``, fully validated; raises only ProtocolError.

    With ``n_embd`` (a stage that expects activations) a batch must carry exactly ``n_rows`` rows
    of ``n_embd`` in its ``wire_dtype``; without it (stage 0) the width is taken from the frame.
    The decoded ``hidden`` is read-only float32: for f32 a view onto frame 1, not a copy.
    """
    if not isinstance(frames, Sequence) or not 1 <= len(frames) <= 2:
        raise _fail("message", "1 or 2 frames", len(frames) if isinstance(frames, Sequence) else frames)
    view = _view(frames[0], 0)
    if view.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"header: {view.nbytes} bytes, over the {MAX_HEADER_BYTES} limit")
    try:
        _VERSION.decode(view)
        msg = _DECODER.decode(view)
    except Exception as exc:  # noqa: BLE001 - msgspec's DecodeError/ValidationError, or anything: a refusal
        raise _refusal(view, exc) from None
    if isinstance(msg, Batch):
        _check_batch(msg)
        return _attach_hidden(msg, frames[1] if len(frames) == 2 else None, n_embd)
    check = _CHECKS.get(type(msg))
    if check is not None:
        check(msg)
    if len(frames) == 2:
        raise ProtocolError(ErrorCode.MALFORMED, f"{_KIND_OF[type(msg)]}: unexpected frame 1; only a batch carries activations")
    return msg
