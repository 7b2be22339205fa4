"""Decoders and encoders compiled from the message schemas: one flat Python function per struct.

The schemas (`skippy.protocol.specs`) check a value through a closure per field, which is what a
failure's field path needs; on the token's critical path that was the larger part of a message's
decode, most of all cold, after llama.cpp has swept the caches (measured: docs/measurements.md,
'Compiled codec'). The functions built here run the same checks inline from generated source, name
no path and raise anything on a bad value; `codec.decode` then decodes again through the schema,
which accepts it after all (never the case, tests/protocol) or raises the ProtocolError that names
the field. Encoders are the reverse: a dataclass's header fields straight into a map, nested structs
through their own encoder.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from skippy.protocol.specs import Spec, _Struct

K = TypeVar("K")
Decoder = Callable[[Any], Any]
Encoder = Callable[[Any], dict[str, Any]]


class _Invalid(Exception):
    """A value the compiled decoder does not accept (the schema is asked again, for the error)."""


class _Source:
    """Generated functions and the constants they use, compiled together."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {"_Invalid": _Invalid, "_isfinite": math.isfinite, "_new": object.__new__}
        self.lines: list[str] = []
        self.done: dict[tuple[str, int], str] = {}  # (decode/encode, id(struct)) -> its function's name

    def const(self, value: Any) -> str:
        name = f"_c{len(self.ns)}"
        self.ns[name] = value
        return name

    def check(self, spec: Spec, var: str, pad: str) -> list[str]:
        """Statements that check `var` against `spec` and leave its decoded value in `var`."""
        if isinstance(spec, _Struct):
            return [f"{pad}{var} = {self.struct(spec)}({var})"]
        test = getattr(spec, "test", None)
        if test is not None:
            return [f"{pad}if not ({test.format(v=var)}): raise _Invalid"]
        if hasattr(spec, "ok"):
            return [f"{pad}if not {self.const(spec.ok)}({var}): raise _Invalid"]
        if hasattr(spec, "enum"):
            members = self.const(spec.enum._value2member_map_)
            return [f"{pad}if type({var}) is not str: raise _Invalid", f"{pad}{var} = {members}[{var}]"]
        if hasattr(spec, "inner"):
            return [f"{pad}if {var} is not None:", *self.check(spec.inner, var, pad + "    ")]
        if hasattr(spec, "item") and hasattr(spec, "max_len"):
            head = [f"{pad}if type({var}) is not tuple or len({var}) > {spec.max_len}: raise _Invalid"]
            item = spec.item
            if getattr(item, "test", None) is not None or hasattr(item, "ok"):  # kept as they are
                return [*head, f"{pad}for _x in {var}:", *self.check(item, "_x", pad + "    ")]
            return [*head, f"{pad}{var} = tuple([{self.item(item)}(_x) for _x in {var}])"]
        return [f"{pad}{var} = {self.const(spec)}({var}, None)"]  # a spec this module does not know

    def item(self, spec: Spec) -> str:
        """A function decoding one item of a sequence."""
        if isinstance(spec, _Struct):
            return self.struct(spec)
        name = f"_item_{len(self.lines)}"
        self.lines += [f"def {name}(v):", *self.check(spec, "v", "    "), "    return v", ""]
        return name

    def struct(self, schema: _Struct) -> str:
        name = self.done.get(("decode", id(schema)))
        if name is not None:
            return name
        name = self.done["decode", id(schema)] = f"_decode_{schema.cls.__name__}_{len(self.done)}"
        if hasattr(schema.cls, "__post_init__") or hasattr(schema.cls, "__slots__"):  # both need __init__
            raise TypeError(f"{schema.cls.__name__}: a message class has no __post_init__ or __slots__")
        body = ["    if type(d) is not dict: raise _Invalid"]
        defaults = {f.name: f for f in dataclasses.fields(schema.cls)}
        args = []
        for i, (field, spec) in enumerate(schema.specs.items()):
            var = f"a{i}"
            args.append(f"{field}={var}")
            if field in schema.optional:
                body += [f"    if {field!r} in d:", f"        {var} = d[{field!r}]",
                         *self.check(spec, var, "        "), f"    else: {var} = {self.default(defaults[field])}"]
            else:
                body += [f"    {var} = d[{field!r}]", *self.check(spec, var, "    ")]
        # fields outside the header (a batch's frame): their defaults
        args += [f"{f.name}={self.default(f)}" for f in defaults.values() if f.name not in schema.specs]
        # the frozen dataclass's __init__ sets each field through object.__setattr__: filling __dict__ at
        # once costs much less, warm and cold (measured: docs/measurements.md, 'Message construction')
        body += [f"    o = _new({self.const(schema.cls)})", f"    o.__dict__.update({', '.join(args)})"]
        if schema.check is not None:
            body.append(f"    {self.const(schema.check)}(o, None)")
        self.lines += [f"def {name}(d):", *body, "    return o", ""]
        return name

    def default(self, f: dataclasses.Field[Any]) -> str:
        """An expression for field `f`'s default, a fresh one per message when it has a default factory."""
        factory = f.default_factory
        return self.const(f.default) if factory is dataclasses.MISSING else f"{self.const(factory)}()"

    def encoder(self, schema: _Struct, head: dict[str, Any] | None = None) -> str:
        """A function making `schema.cls`'s map; `head`: constant entries first (a message's version and kind)."""
        key = ("encode" if head is None else "message", id(schema))
        name = self.done.get(key)
        if name is not None:
            return name
        name = self.done[key] = f"_{key[0]}_{schema.cls.__name__}_{len(self.done)}"
        items = [f"{k!r}: {self.const(v)}" for k, v in (head or {}).items()]
        items += [f"{field!r}: {self.encoded(spec, f'o.{field}')}" for field, spec in schema.specs.items()]
        fields = ", ".join(items)
        self.lines += [f"def {name}(o):", f"    return {{{fields}}}", ""]
        return name

    def encoded(self, spec: Spec, value: str) -> str:
        """An expression for `value` as msgpack takes it."""
        if isinstance(spec, _Struct):
            return f"{self.encoder(spec)}({value})"
        if hasattr(spec, "inner") and isinstance(spec.inner, _Struct):
            return f"(None if {value} is None else {self.encoder(spec.inner)}({value}))"
        if hasattr(spec, "item") and isinstance(spec.item, _Struct):
            return f"[{self.encoder(spec.item)}(_x) for _x in {value}]"
        return value  # numbers, strings, enums (str), maps and tuples of them go as they are

    def compile(self) -> None:
        exec(compile("\n".join(self.lines), "<skippy.protocol.compiled>", "exec"), self.ns)  # noqa: S102 - our own source


def compile_schemas(schemas: Mapping[K, _Struct], version: int) -> tuple[dict[K, Decoder], dict[type, Encoder]]:
    """A compiled decoder per message kind, and per message class an encoder of its whole header
    (`v`: the protocol version, `k`: the kind, then the fields)."""
    for schema in schemas.values():  # an encoder sends the schema's fields: it must have every header field
        header = {f.name for f in dataclasses.fields(schema.cls) if not f.metadata}
        if header != set(schema.specs):
            raise TypeError(f"{schema.cls.__name__}: schema fields {sorted(schema.specs)}"
                            f" are not its header fields {sorted(header)}")
    source = _Source()
    decoders = {kind: source.struct(schema) for kind, schema in schemas.items()}
    encoders = {schema.cls: source.encoder(schema, {"v": version, "k": str(kind)}) for kind, schema in schemas.items()}
    source.compile()
    return ({kind: source.ns[name] for kind, name in decoders.items()},
            {cls: source.ns[name] for cls, name in encoders.items()})
