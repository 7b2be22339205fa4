"""Batch activations on the wire as f32 (bitwise), f16 (saturating) and q8 (per-row absmax int8 + scale).

Each dtype round-trips within its stated bound, takes the stated bytes per row, says its dtype in
the header, and a frame of the wrong size for its dtype is refused with ProtocolError. The stage
flag `--activation-wire-dtype` resolves into the link's WireCondition, and SetWire can switch it
on a running link without touching the delay fields' meaning.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from skippy.config import ConfigError, WireChoice, WireCondition, parse_serving_args
from skippy.config.serving_args import Owner, flag_owner
from skippy.driver.wire_certify import MARGIN_EPS, agreement
from skippy.launcher import write_local_topology
from skippy.protocol import Batch, ProtocolError, SetWire, Window, WireDtype, decode, encode
from skippy.protocol.activations import row_bytes
from skippy.stage.links import apply_wire

N_EMBD = 640
WINDOWS = (Window(7, 0, 2, outputs=(1,)), Window(9, 12, 1, outputs=(0,)))
HIDDEN = (np.random.default_rng(3).standard_normal((3, N_EMBD)) * 50).astype(np.float32)
ALL = list(WireDtype)
TINY = 127 * float(np.finfo(np.float32).tiny)  # a q8 row this small has a subnormal (or zero) scale


def round_trip(hidden: np.ndarray, dtype: WireDtype, n_embd: int | None = None) -> tuple[Batch, list[Any]]:
    windows = (Window(1, 0, hidden.shape[0]),)
    frames = encode(Batch(4, windows, hidden, wire_dtype=dtype))
    decoded = decode(frames, n_embd=n_embd)
    assert isinstance(decoded, Batch) and decoded.hidden is not None
    assert decoded.wire_dtype is dtype and decoded.hidden.dtype == np.float32 and not decoded.hidden.flags.writeable
    return decoded, frames


def rejects(frames: list[Any], code: str, *, n_embd: int | None = None) -> str:
    with pytest.raises(ProtocolError) as info:
        decode(frames, n_embd=n_embd)
    assert info.value.code == code, info.value
    return info.value.message


@pytest.mark.parametrize("dtype", ALL)
def test_bytes_per_row_and_header(dtype: WireDtype) -> None:
    decoded, frames = round_trip(HIDDEN, dtype, N_EMBD)
    assert len(frames[1]) == 3 * row_bytes(dtype, N_EMBD)
    assert {WireDtype.F32: 4 * N_EMBD, WireDtype.F16: 2 * N_EMBD, WireDtype.Q8: 4 + N_EMBD}[dtype] == row_bytes(dtype, N_EMBD)
    assert msgpack.unpackb(frames[0], strict_map_key=False)["wire_dtype"] == dtype.value
    assert row_bytes(WireDtype.Q8, 2048) == 2052 and row_bytes(WireDtype.F16, 2048) == 4096  # the reference's figures


def test_f32_is_bitwise_and_the_default() -> None:
    decoded, _ = round_trip(HIDDEN, WireDtype.F32, N_EMBD)
    assert decoded.hidden is not None and decoded.hidden.tobytes() == HIDDEN.tobytes()
    assert Batch(1, WINDOWS).wire_dtype is WireDtype.F32


def test_f16_is_half_rounding_and_saturates() -> None:
    hidden = HIDDEN.copy()
    hidden[0, :3] = (1e5, -1e6, 65504.0)
    decoded, _ = round_trip(hidden, WireDtype.F16, N_EMBD)
    assert decoded.hidden is not None
    assert decoded.hidden[0, :3].tolist() == [65504.0, -65504.0, 65504.0]  # saturated, not inf
    assert np.array_equal(decoded.hidden[1:], hidden[1:].astype(np.float16).astype(np.float32))


def test_q8_error_is_at_most_half_a_step_per_row() -> None:
    hidden = HIDDEN.copy()
    hidden[1] = 0.0  # an all-zero row has scale 0 and decodes to zeros
    decoded, frames = round_trip(hidden, WireDtype.Q8, N_EMBD)
    assert decoded.hidden is not None
    step = np.abs(hidden).max(axis=1) / 127
    assert np.all(np.abs(decoded.hidden - hidden) <= step[:, None] * 0.5 + 1e-6 * np.abs(hidden) + 1e-30)
    assert np.all(decoded.hidden[1] == 0.0)
    scales = np.frombuffer(bytes(frames[1])[:12], "<f4")
    assert np.allclose(scales, step)  # scales first, then the int8 rows


def test_q8_refuses_non_finite_activations() -> None:
    hidden = HIDDEN.copy()
    hidden[2, 5] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        encode(Batch(1, WINDOWS, hidden, wire_dtype=WireDtype.Q8))


@pytest.mark.parametrize("dtype", ALL)
def test_frame_size_must_match_the_dtype(dtype: WireDtype) -> None:
    header, frame = encode(Batch(2, WINDOWS, HIDDEN, wire_dtype=dtype))
    data = bytes(frame)
    assert "n_embd 640" in rejects([header, data[:-1]], "n_embd", n_embd=N_EMBD)
    rejects([header, data + b"\0" * 4], "n_embd", n_embd=N_EMBD)
    rejects([header, data], "n_embd", n_embd=N_EMBD + 1)
    rejects([header], "n_embd", n_embd=N_EMBD)
    rejects([header, b""], "malformed")
    rejects([header, data[:-1]], "malformed")  # no n_embd: not whole rows of this dtype
    for other in ALL:  # the same frame under another dtype's header is refused by size
        if other is not dtype:
            relabelled = msgpack.packb({**msgpack.unpackb(header, strict_map_key=False), "wire_dtype": other.value})
            rejects([relabelled, data], "n_embd", n_embd=N_EMBD)


def test_q8_scales_must_be_finite_and_non_negative() -> None:
    header, frame = encode(Batch(2, WINDOWS, HIDDEN, wire_dtype=WireDtype.Q8))
    for bad in (np.nan, -1.0, np.inf):
        data = bytearray(frame)
        data[4:8] = np.float32(bad).tobytes()
        assert "scale" in rejects([header, data], "malformed", n_embd=N_EMBD)


def test_header_without_wire_dtype_means_f32_and_unknown_dtype_is_refused() -> None:
    header, frame = encode(Batch(2, WINDOWS, HIDDEN))
    fields = msgpack.unpackb(header, strict_map_key=False)
    del fields["wire_dtype"]  # an older peer
    decoded = decode([msgpack.packb(fields), frame], n_embd=N_EMBD)
    assert isinstance(decoded, Batch) and decoded.wire_dtype is WireDtype.F32 and np.array_equal(decoded.hidden, HIDDEN)
    assert "wire_dtype" in rejects([msgpack.packb({**fields, "wire_dtype": "bf16"}), frame], "malformed")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALL), st.integers(1, 5).flatmap(lambda rows: st.integers(1, 9).flatmap(
    lambda n_embd: hnp.arrays(np.float32, (rows, n_embd), elements=st.floats(-1e4, 1e4, width=32)))))
def test_any_rows_round_trip_within_the_dtype_bound(dtype: WireDtype, hidden: np.ndarray) -> None:
    for n_embd in (None, hidden.shape[1]):
        decoded, _ = round_trip(hidden, dtype, n_embd)
        assert decoded.hidden is not None and decoded.hidden.shape == hidden.shape
        bound = {WireDtype.F32: 0.0 * hidden, WireDtype.F16: np.abs(hidden) * 2.0**-11 + 2.0**-24,
                 WireDtype.Q8: np.abs(hidden).max(axis=1, keepdims=True) / 254 * (1 + 1e-6) + TINY + 0.0 * hidden}[dtype]
        assert np.all(np.abs(decoded.hidden - hidden) <= bound)


# --- the stage flag and the live switch (SetWire) ---


def test_set_wire_carries_an_optional_dtype_and_apply_wire_keeps_it() -> None:
    for msg in (SetWire(5.0), SetWire(5.0, 10.0, WireDtype.Q8)):
        assert decode(encode(msg)) == msg
    old = msgpack.unpackb(encode(SetWire(5.0))[0], strict_map_key=False)
    del old["activation_dtype"]  # an older sender
    assert decode([msgpack.packb(old)]) == SetWire(5.0)
    link = SimpleNamespace(endpoint="tcp://x:1", wire=WireCondition(activation_dtype=WireDtype.F16))
    log = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    apply_wire(link, SetWire(20.0), log)  # type: ignore[arg-type]  # only .wire and .endpoint are used
    assert link.wire == WireCondition(delay_ms=20.0, activation_dtype=WireDtype.F16)
    apply_wire(link, SetWire(0.0, None, WireDtype.Q8), log)  # type: ignore[arg-type]
    assert link.wire == WireCondition(activation_dtype=WireDtype.Q8)


def test_activation_wire_dtype_flag(tmp_path: Path) -> None:
    _, configs = write_local_topology(tmp_path, "/nonexistent/model.gguf", 4, [2])
    base = ["--config", str(configs[0])]
    assert parse_serving_args(base).wire.activation_dtype is WireDtype.F32
    assert parse_serving_args([*base, "--activation-wire-dtype", "q8"]).wire.activation_dtype is WireDtype.Q8
    with pytest.raises(ConfigError, match=r"--activation-wire-dtype must be one of f32 \| f16 \| q8 \| auto, got 'bf16'"):
        parse_serving_args([*base, "--activation-wire-dtype", "bf16"])
    assert flag_owner("--activation-wire-dtype") is Owner.EVERY_STAGE  # skippy up hands it to every stage
    auto = parse_serving_args([*base, "--activation-wire-dtype", "auto"])
    assert auto.activation_wire is WireChoice.AUTO and auto.wire.activation_dtype is WireDtype.F32 and auto.certify_wire
    assert not parse_serving_args([*base, "--activation-wire-dtype", "q8", "--no-activation-wire-certify"]).certify_wire


def test_a_whole_chain_set_wire_switches_only_the_dtype_and_goes_on_down() -> None:
    msg = SetWire(0.0, None, WireDtype.Q8, whole_chain=True)
    assert decode(encode(msg)) == msg
    sent: list[Any] = []
    link = SimpleNamespace(endpoint="tcp://x:1", wire=WireCondition(delay_ms=20.0, mbps=5.0), enqueue=sent.append)
    log = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    apply_wire(link, msg, log)  # type: ignore[arg-type]  # only .wire, .endpoint and .enqueue are used
    assert link.wire == WireCondition(delay_ms=20.0, mbps=5.0, activation_dtype=WireDtype.Q8)  # the delay is kept
    assert sent == [msg]  # forwarded to the next stage, ahead of what this stage forwards after it
    apply_wire(None, msg, log)  # the final stage: the end of the chain, nothing to warn about


def test_agreement_counts_only_positions_where_f32_is_decisive() -> None:
    reference = [(5, 3.0), (6, 0.1), (7, 2.0), (8, 0.6)]
    assert agreement(reference, [(5, 2.0), (9, 0.0), (7, 1.0), (8, 0.1)]) == (1.0, 3)  # the near-tie flip is not counted
    assert agreement(reference, [(5, 2.0), (6, 0.0), (1, 1.0), (8, 0.1)]) == (2 / 3, 3)
    assert agreement([(1, MARGIN_EPS)], [(2, 1.0)]) == (1.0, 0)  # no decisive position: nothing to disagree with
