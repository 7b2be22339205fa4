"""Validation of decoded protocol values: each Spec checks one value and names its path on failure.

The building blocks of `skippy.protocol.codec`'s message schemas; every failure is a ProtocolError.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any, TypeAlias

from skippy.protocol.messages import ErrorCode, ProtocolError

_U63 = 2**63 - 1

# a spec checks (value, path): path names the value in a failure. Messages are decoded by functions
# compiled from these specs (skippy.protocol.compiled) and through the specs only to explain a failure.
Spec: TypeAlias = Callable[[Any, str | None], Any]


def _show(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if type(value) in (int, float) else f"{type(value).__name__} {text}"


def _fail(path: str | None, expected: str, value: Any) -> ProtocolError:
    return ProtocolError(ErrorCode.MALFORMED, f"{path}: expected {expected}, got {_show(value)}")


def _atom(expected: str, ok: Callable[[Any], bool], test: str | None = None) -> Spec:
    """A value kept as it is if `ok(value)`. `test`: the same check as a Python expression of `{v}`, for the
    compiled decoders (skippy.protocol.compiled); without it they call `ok`."""
    def parse(value: Any, path: str | None) -> Any:
        if not ok(value):
            raise _fail(path, expected, value)
        return value

    parse.ok, parse.test = ok, test  # type: ignore[attr-defined]
    return parse


def _int(lo: int = 0, hi: int = _U63) -> Spec:
    rule = f">= {lo}" if hi == _U63 else f"in [{lo}, {hi}]"
    return _atom(f"int {rule}", lambda v: type(v) is int and lo <= v <= hi,  # type() rejects bool
                 f"type({{v}}) is int and {lo} <= {{v}} <= {hi}")


_str = _atom("str", lambda v: type(v) is str, "type({v}) is str")
_float = _atom("finite number", lambda v: type(v) is int or type(v) is float and math.isfinite(v),
               "type({v}) is int or type({v}) is float and _isfinite({v})")
_str_keyed_map = _atom("map with str keys", lambda v: type(v) is dict and all(type(k) is str for k in v))


def _enum(kind: type[enum.StrEnum]) -> Spec:
    names = ", ".join(member.value for member in kind)

    def parse(value: Any, path: str | None) -> Any:
        if type(value) is not str or value not in kind._value2member_map_:
            raise _fail(path, f"one of {names}", value)
        return kind(value)

    parse.enum = kind  # type: ignore[attr-defined]
    return parse


def _seq(item: Spec, max_len: int) -> Spec:
    def parse(value: Any, path: str | None) -> tuple[Any, ...]:
        if type(value) is not tuple:  # unpacked with use_list=False
            raise _fail(path, "array", value)
        if len(value) > max_len:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"{path}: expected at most {max_len} items, got {len(value)}")
        return tuple(item(x, f"{path}[{i}]") for i, x in enumerate(value))

    parse.item, parse.max_len = item, max_len  # type: ignore[attr-defined]
    return parse


def _opt(spec: Spec) -> Spec:
    def parse(value: Any, path: str | None) -> Any:
        return None if value is None else spec(value, path)

    parse.inner = spec  # type: ignore[attr-defined]
    return parse


class _Struct:
    """A map decoded field by field into ``cls``, then checked as a whole.

    Fields named in ``optional`` were added later: a peer that does not send one gets ``cls``'s default.
    """

    def __init__(self, cls: type, check: Callable[[Any, str | None], None] | None = None, *, optional: tuple[str, ...] = (),
                 **specs: Spec) -> None:
        self.cls, self.check, self.specs, self.optional = cls, check, specs, frozenset(optional)

    def __call__(self, value: Any, path: str | None) -> Any:
        if type(value) is not dict:
            raise _fail(path, "map", value)
        missing = [name for name in self.specs if name not in value and name not in self.optional]
        if missing:
            raise ProtocolError(ErrorCode.MALFORMED, f"{path}: missing field(s) {', '.join(missing)}")
        obj = self.cls(**{name: spec(value[name], f"{path}.{name}") for name, spec in self.specs.items() if name in value})
        if self.check is not None:
            self.check(obj, path)
        return obj
