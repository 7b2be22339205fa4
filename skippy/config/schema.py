"""Generic JSON <-> frozen-dataclass conversion shared by every config type.

Config types are frozen dataclasses deriving from :class:`ConfigModel`.  Their
field annotations are the schema: ``str``, ``bool``, ``int`` (always
non-negative; ``SignedInt`` where a field may be negative), ``float``, ``str`` enums,
nested config dataclasses, ``tuple[X, ...]`` and ``X | None``.  On
construction every field is type-checked and normalised (enum strings become
members, JSON objects become nested dataclasses, lists become tuples), then
the class's own ``_check`` applies its value rules.  :func:`build_dataclass`
adds the JSON-only rules (unknown keys, missing required fields), and
:func:`dump_dataclass` turns an instance back into JSON-ready data.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, NewType, Self, TypeVar

from skippy.config.errors import ConfigError, FieldError

__all__ = [
    "ConfigModel",
    "SignedInt",
    "build_dataclass",
    "check",
    "dump_dataclass",
    "load_json_object",
    "parse_json_object",
    "show",
]

T = TypeVar("T")
# An int field that may be negative (`n_gpu_layers: -1` = every layer); plain `int` fields are >= 0.
SignedInt = NewType("SignedInt", int)
_MISSING = dataclasses.MISSING


def show(value: Any) -> str:
    """A short, JSON-looking rendering of ``value`` for error messages."""
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of ``cls``'s init fields, computed once per class."""
    cached = _FIELD_TYPES.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        cached = _FIELD_TYPES[cls] = {f.name: hints[f.name] for f in fields if f.init}
    return cached


def _optional_inner(tp: Any) -> Any | None:
    """``X`` for an ``X | None`` annotation, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported config annotation {tp!r}")
        return inner[0]
    return None


def _describe(tp: Any) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return f"{_describe(inner)} or null"
    if typing.get_origin(tp) is tuple:
        return f"a list of {_describe(typing.get_args(tp)[0]).removeprefix('a ')}s"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(f"'{member.value}'" for member in tp)
    if dataclasses.is_dataclass(tp):
        return "a JSON object"
    if tp is SignedInt:
        return "an integer"
    return {
        bool: "a boolean",
        int: "a non-negative integer",
        float: "a number",
        str: "a string",
    }[tp]


def coerce(value: Any, tp: Any, field: str) -> Any:
    """Check ``value`` against annotation ``tp``; return its normalised form."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if value is None else _coerce_present(value, inner, tp, field)
    return _coerce_present(value, tp, tp, field)


def _coerce_present(value: Any, tp: Any, declared: Any, field: str) -> Any:
    def wrong() -> FieldError:
        return FieldError(field, f"must be {_describe(declared)}, got {show(value)}")

    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)):
            raise wrong()
        item_tp = typing.get_args(tp)[0]
        return tuple(coerce(item, item_tp, f"{field}[{i}]") for i, item in enumerate(value))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        if isinstance(value, str):
            try:
                return tp(value)
            except ValueError:
                raise wrong() from None
        raise wrong()
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):
            return build_dataclass(tp, value, field)
        raise wrong()
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong()
        return value
    if tp is int or tp is SignedInt:
        if isinstance(value, bool) or not isinstance(value, int) or (tp is int and value < 0):
            raise wrong()
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong()
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise wrong()
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for field {field!r}")


def check(condition: bool, field: str, reason: str) -> None:
    """Raise ``FieldError(field, reason)`` unless ``condition`` holds."""
    if not condition:
        raise FieldError(field, reason)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def build_dataclass(cls: type[T], data: Any, path: str = "") -> T:
    """Build config dataclass ``cls`` from a JSON object.

    Rejects non-objects, unknown keys and missing required fields; the
    dataclass itself type-checks and validates the values.  Errors are
    :class:`FieldError` with the field path relative to the root object
    (``path`` is this object's own path inside the root).
    """
    if not isinstance(data, dict):
        raise FieldError(path or "<root>", f"must be a JSON object, got {show(data)}")
    known = _field_types(cls)
    for key in data:
        if key not in known:
            raise FieldError(
                _join(path, str(key)),
                f"is not a known {cls.__name__} field (known: {', '.join(known)})",
            )
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        required = f.default is _MISSING and f.default_factory is _MISSING
        if f.init and required and f.name not in data:
            raise FieldError(_join(path, f.name), "is required")
    try:
        return cls(**data)
    except FieldError as error:
        raise error.prefixed(path) from None


def dump_dataclass(value: Any) -> Any:
    """JSON-ready form of a config value (dataclass, enum, tuple or scalar)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump_dataclass(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [dump_dataclass(item) for item in value]
    return value


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def parse_json_object(text: str, source: str) -> dict[str, Any]:
    """Parse ``text`` as a JSON object; errors name ``source`` and line/column."""
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{source}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}"
        ) from None
    except _DuplicateKey as error:
        raise ConfigError(f"{source}: duplicate key '{error.key}'") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top-level JSON value must be an object, got {show(data)}")
    return data


def load_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and parse a JSON object file; every failure is a ConfigError naming it."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{source}: config file is not UTF-8 ({error.reason})") from None
    except OSError as error:
        raise ConfigError(f"{source}: cannot read config file: {error.strerror or error}") from None
    return parse_json_object(text, source)


class ConfigModel:
    """Mixin for frozen config dataclasses: checked construction and JSON I/O."""

    def __post_init__(self) -> None:
        for name, tp in _field_types(type(self)).items():
            object.__setattr__(self, name, coerce(getattr(self, name), tp, name))
        self._check()

    def _check(self) -> None:
        """Value rules beyond types; raise FieldError. Override as needed."""

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> Self:
        """Build from a parsed JSON object; errors are ``<source>: field ...``."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {show(data)}")
        try:
            return build_dataclass(cls, data)
        except FieldError as error:
            raise error.in_source(source) from None

    @classmethod
    def from_json(cls, text: str, source: str = "<json>") -> Self:
        return cls.from_dict(parse_json_object(text, source), source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Load and validate a JSON file; errors name the file and the field."""
        return cls.from_dict(load_json_object(path), str(path))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with every field; ``from_dict(to_dict())`` round-trips."""
        data = dump_dataclass(self)
        assert isinstance(data, dict)
        return data

    def to_json(self) -> str:
        """Stable JSON text: sorted keys, two-space indent, trailing newline."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2) + "\n"
