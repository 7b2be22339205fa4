"""A refused header, in skippy's words: which rule it broke and the field's path, with the value.

msgspec's ValidationError names the path (`$.windows[2].n_tokens`) but not the value nor skippy's error
classes; this module looks at a refused header again, as plain values, in the order the wire's rules
go: valid msgpack, a map, its version `v`, its kind `k`, then the field (`batch.windows[2].n_tokens:
expected int >= 1, got -3`). It runs only on a refusal, never on a message that decodes.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import msgspec.inspect as mi

from skippy.protocol.messages import PROTOCOL_VERSION, ErrorCode, Message, ProtocolError

__all__ = ["KINDS", "KIND_OF", "fail", "refusal", "show"]

_U63 = 2**63 - 1
KINDS: dict[str, type[Any]] = {cls.__struct_config__.tag: cls for cls in Message.__args__}  # k -> message class
KIND_OF: dict[type, str] = {cls: kind for kind, cls in KINDS.items()}
_ANY = msgspec.msgpack.Decoder()  # a refused header, as plain values
MAX_REQUEST_ID_CHARS = 200  # a longer "request_id" in a refused header is not taken as one


def show(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if type(value) in (int, float) else f"{type(value).__name__} {text}"


def fail(path: str, expected: str, value: Any) -> ProtocolError:
    return ProtocolError(ErrorCode.MALFORMED, f"{path}: expected {expected}, got {show(value)}")


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
        _TYPE_INFO[kind] = mi.type_info(KINDS[kind])
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
    return fail(path, _expected(t), value)


def refusal(view: memoryview, exc: Exception) -> ProtocolError:
    """The ProtocolError for a header the Decoder refused with `exc`: which rule, said as skippy says it.
    In the old order: msgpack, a map, the version, the kind, then the fields."""
    try:
        raw = _ANY.decode(view)
    except Exception as again:  # noqa: BLE001 - not msgpack at all (msgspec's DecodeError, or too deep)
        reason = str(again).removeprefix("MessagePack data is malformed: ") or type(again).__name__
        return ProtocolError(ErrorCode.MALFORMED, f"header: not valid msgpack ({reason[:100]})")
    if type(raw) is not dict:
        return fail("header", "map", raw)
    if "v" not in raw:
        return ProtocolError(ErrorCode.MALFORMED, "header: missing field(s) v (the protocol version)")
    version = raw["v"]
    if type(version) is not int or not 0 <= version <= _U63:
        return fail("header.v", "int >= 0", version)
    if version != PROTOCOL_VERSION:
        return ProtocolError(ErrorCode.VERSION, f"peer speaks protocol version {version}, this build speaks {PROTOCOL_VERSION}")
    kind = raw.get("k")
    if type(kind) is not str:
        return fail("header.k", "str", kind)
    if kind not in KINDS:
        known = ", ".join(KINDS)
        return ProtocolError(ErrorCode.UNKNOWN_KIND, f"header.k: unknown message kind {kind[:60]!r} (known: {known})")
    refused = (ProtocolError(ErrorCode.MALFORMED, f"{kind}: {str(exc)[:200]}")
               if not isinstance(exc, msgspec.ValidationError) else _explain(kind, raw, str(exc)))
    request_id = raw.get("request_id")
    if type(request_id) is str and 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
        refused.request_id = request_id
    return refused
