"""How a batch's activations travel in frame 1: float32, float16, or 8-bit rows with a scale.

A batch header's ``wire_dtype`` names the encoding (`WireDtype`); whatever it is, the receiver
gets float32 ``[n_rows, n_embd]`` back, which is what llama.cpp takes.

- ``f32``: the rows as little-endian float32, C order, sent as a zero-copy view: bitwise exact.
- ``f16``: little-endian IEEE half. Values beyond half's range (+-65504) saturate to it instead
  of becoming inf (Gemma 3's residual stream goes beyond half's range in a few channels of the first row;
  measured: docs/measurements.md, 'Activation magnitudes').
- ``q8``: per-row absmax int8. The frame is every row's float32 scale (``absmax / 127``) first,
  then every row's int8 values: ``4 + n_embd`` bytes per row. A row decodes as ``q * scale``.

Bytes per row for n_embd 2048: f32 8,192, f16 4,096, q8 2,052.
"""

from __future__ import annotations

import numpy as np

from skippy.protocol.kinds import ErrorCode, WireDtype
from skippy.protocol.messages import ProtocolError

__all__ = ["pack", "row_bytes", "unpack"]

_F32, _F16, _I8 = np.dtype("<f4"), np.dtype("<f2"), np.dtype("i1")
_F16_MAX = float(np.finfo(np.float16).max)
_Q8_MAX = 127.0


def row_bytes(dtype: WireDtype, n_embd: int) -> int:
    """Bytes one row of ``n_embd`` activations takes on the wire."""
    if dtype is WireDtype.F16:
        return 2 * n_embd
    if dtype is WireDtype.Q8:
        return 4 + n_embd
    return 4 * n_embd


def pack(hidden: np.ndarray, dtype: WireDtype) -> memoryview:
    """Frame 1 for float32 ``hidden [n_rows, n_embd]`` (C order) in ``dtype``; f32 is not copied."""
    if dtype is WireDtype.F16:
        data = np.clip(hidden, -_F16_MAX, _F16_MAX).astype(_F16)
    elif dtype is WireDtype.Q8:
        absmax = np.max(np.abs(hidden), axis=1) if hidden.size else np.zeros(hidden.shape[0], _F32)
        if not np.all(np.isfinite(absmax)):
            raise ValueError("q8 cannot encode non-finite activations")
        scale = (absmax / _Q8_MAX).astype(_F32)
        wide = absmax.astype(np.float64)  # 127 / absmax overflows float32 for tiny rows
        inverse = np.divide(_Q8_MAX, wide, out=np.zeros_like(wide), where=wide > 0)
        values = np.clip(np.rint(hidden * inverse[:, None]), -_Q8_MAX, _Q8_MAX).astype(_I8)
        data = np.concatenate([scale.view(np.uint8), values.reshape(-1).view(np.uint8)])
    else:
        data = hidden
    return memoryview(data).cast("B")


def _width(nbytes: int, n_rows: int, dtype: WireDtype) -> int | None:
    """n_embd implied by a frame of ``nbytes`` for ``n_rows`` rows (None: no whole width fits)."""
    if dtype is WireDtype.Q8:
        return nbytes // n_rows - 4 if nbytes % n_rows == 0 and nbytes // n_rows > 4 else None
    item = 2 if dtype is WireDtype.F16 else 4
    return nbytes // (n_rows * item) if nbytes and nbytes % (n_rows * item) == 0 else None


def _describe(dtype: WireDtype) -> str:
    return {WireDtype.F32: "float32", WireDtype.F16: "float16", WireDtype.Q8: "q8 (4 + n_embd bytes per row)"}[dtype]


def unpack(view: memoryview, n_rows: int, n_embd: int | None, dtype: WireDtype) -> np.ndarray:
    """Read-only float32 ``[n_rows, n_embd]`` from frame 1; raises ProtocolError on a size mismatch.

    With ``n_embd`` (a stage that knows its width) the frame must be exactly that wide; without it
    the width is taken from the frame. f32 is a view onto the frame, f16 and q8 a new array.
    """
    got = f"an activation frame of {view.nbytes} bytes"
    if n_embd is not None and view.nbytes != n_rows * row_bytes(dtype, n_embd):
        raise ProtocolError(ErrorCode.N_EMBD, f"batch: expected {n_rows} rows x n_embd {n_embd} {_describe(dtype)},"
                                              f" got {got}")
    width = _width(view.nbytes, n_rows, dtype)
    if width is None:
        raise ProtocolError(ErrorCode.MALFORMED, f"batch: expected {n_rows} rows x n_embd {_describe(dtype)}, got {got}")
    if dtype is WireDtype.F32:
        hidden = np.frombuffer(view, dtype=_F32).reshape(n_rows, width)
    elif dtype is WireDtype.F16:
        hidden = np.frombuffer(view, dtype=_F16).reshape(n_rows, width).astype(_F32)
    else:
        scale = np.frombuffer(view, dtype=_F32, count=n_rows)
        if not np.all(np.isfinite(scale) & (scale >= 0)):
            raise ProtocolError(ErrorCode.MALFORMED, "batch: q8 row scales must be finite and >= 0")
        values = np.frombuffer(view, dtype=_I8, offset=4 * n_rows).reshape(n_rows, width)
        hidden = values.astype(_F32) * scale[:, None]
    hidden.flags.writeable = False
    return hidden
