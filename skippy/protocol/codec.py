"""Encoding and validation of protocol messages: msgpack header frame plus, for a batch, its activations.

The header is encoded and decoded by msgspec against the message Structs (`skippy.protocol.messages`):
one module-level Encoder, and one Decoder of the tagged union of every kind (on ``k``, the version
a ``Literal`` on ``v``), so a decode is one C call that checks every field's type and value rule,
then the few rules across fields that a type cannot say (`_check_batch` and its kin below). A
refused header is looked at again, slowly, to say why in skippy's words (`refusals`): the ErrorCode (a wrong
version or an unknown kind before anything else, an over-long array ``too_large``) and the field's
path, ``batch.windows[2].n_tokens: expected int >= 1, got -3``.

Every field is always written; a missing field with a default takes it, except ``v``: every header
must carry its version (checked first, by a decode that reads only ``v``); unknown keys are
ignored, except ``hidden`` on a batch, which may only be nil (activations travel in frame 1).
`decode` raises only ProtocolError, so a process can answer a bad peer and keep serving.
How the activations are packed (f32, f16, q8) is in `activations`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
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
    MessageBase,
    Predictions,
    ProtocolError,
    Ready,
    StageIdentity,
    Window,
)
from skippy.protocol.refusals import KIND_OF, fail, refusal

if TYPE_CHECKING:
    import zmq

__all__ = ["MAX_HEADER_BYTES", "MAX_ROWS", "MAX_SESSIONS_PER_MESSAGE", "MAX_WINDOWS", "PROTOCOL_VERSION", "decode",
           "encode"]

_F32 = np.dtype("<f4")

# A batch's header: its fields but `hidden` (which travels as frame 1), as msgspec writes them.
_BatchHeader = msgspec.defstruct(
    "_BatchHeader", [(f.name, f.type) for f in msgspec.structs.fields(Batch) if f.name not in ("hidden", "v")],
    bases=(MessageBase,), tag=KIND_OF[Batch], frozen=True)


def _numpy_scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot put {type(value).__name__} on the wire")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_numpy_scalar)
_DECODER = msgspec.msgpack.Decoder(Message)


class _Version(msgspec.Struct):
    """Every header's `v`, required: a message's own `v` defaults (so code never passes it), the wire's does not."""

    v: int


_VERSION = msgspec.msgpack.Decoder(_Version)  # skips the other fields in C: a fraction of a message's decode


# --- what the types cannot say ---


def _check_identity(s: StageIdentity, path: str) -> None:
    if s.layer_end < s.layer_start:
        raise fail(f"{path}.layer_end", f"int >= layer_start {s.layer_start}", s.layer_end)


def _check_hello(msg: Hello | Ready) -> None:
    _check_identity(msg.sender, f"{KIND_OF[type(msg)]}.sender")


def _check_window(w: Window, i: int) -> None:
    """Window ``i`` of a batch: outputs strictly increasing in [0, n_tokens); a verify window (draft or head)
    of n rows carries n - 1 draft tokens and wants every row's output; a restore is of pos_start positions,
    a record at most the window's end."""
    out = w.outputs
    if out and (out[-1] >= w.n_tokens or any(a >= b for a, b in zip(out, out[1:]))):
        raise fail(f"batch.windows[{i}].outputs", f"strictly increasing offsets in [0, {w.n_tokens})", list(out))
    if (w.draft or w.head is not None) and (len(w.draft) != w.n_tokens - 1 or out != tuple(range(w.n_tokens))):
        raise ProtocolError(ErrorCode.MALFORMED, f"batch.windows[{i}].draft: a verify window of {w.n_tokens} rows"
                            f" carries n_tokens - 1 draft tokens and wants every row's output, got {len(w.draft)}"
                            f" draft tokens and outputs {list(out)}")
    if w.restore is not None and w.restore.n_tokens != w.pos_start:
        raise fail(f"batch.windows[{i}].restore.n_tokens", f"the window's pos_start {w.pos_start}", w.restore.n_tokens)
    end = w.pos_start + w.n_tokens
    if any(r.n_tokens > end for r in w.record):
        raise fail(f"batch.windows[{i}].record", f"entries of at most the window's end {end} tokens",
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


# --- encode / decode ---


def encode(msg: Message) -> list[bytes | memoryview]:
    """Frames for ``msg``; a batch's activations go packed as its ``wire_dtype`` says (f32: a zero-copy
    view of a '<f4' C array).

    Raises TypeError for a non-message and ValueError for a message no peer would accept
    (hidden of the wrong shape, header over MAX_HEADER_BYTES).
    """
    if isinstance(msg, Batch):
        header = _ENCODER.encode(_BatchHeader(msg.batch_id, msg.windows, msg.timings, msg.wire_dtype, msg.missed))
    elif type(msg) in KIND_OF:
        header = _ENCODER.encode(msg)
    else:
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"{KIND_OF[type(msg)]} header is {len(header)} bytes, over MAX_HEADER_BYTES {MAX_HEADER_BYTES}")
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
        raise fail("message", "1 or 2 frames", len(frames) if isinstance(frames, Sequence) else frames)
    view = _view(frames[0], 0)
    if view.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"header: {view.nbytes} bytes, over the {MAX_HEADER_BYTES} limit")
    try:
        _VERSION.decode(view)
        msg = _DECODER.decode(view)
    except Exception as exc:  # noqa: BLE001 - msgspec's DecodeError/ValidationError, or anything: a refusal
        raise refusal(view, exc) from None
    if isinstance(msg, Batch):
        _check_batch(msg)
        return _attach_hidden(msg, frames[1] if len(frames) == 2 else None, n_embd)
    check = _CHECKS.get(type(msg))
    if check is not None:
        check(msg)
    if len(frames) == 2:
        raise ProtocolError(ErrorCode.MALFORMED, f"{KIND_OF[type(msg)]}: unexpected frame 1; only a batch carries activations")
    return msg
