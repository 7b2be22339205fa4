"""Client JSON read within bounds: the one parser of request bodies (and of JSON text inside them).

`json.loads` alone lets hostile input through in ways that end as a 500 or worse: nesting deep enough
to exhaust the interpreter's recursion (a RecursionError), or nested just under that, to break whatever
walks the value next (schema builders, the chat template, `json.dumps`); an integer past Python's
int-string conversion limit (a ValueError that talks about `sys.set_int_max_str_digits`); the
constants NaN and Infinity, which Python accepts and JSON does not; and `\\ud800`-style escapes of a
lone UTF-16 surrogate, which make a `str` that cannot be encoded (the tokenizer fails on it).
`loads` refuses each with a `JsonBodyError` (a ValueError) saying what is wrong in the client's terms;
the caller turns it into a 400 naming the body or the field. A float beyond the double range (1e400)
parses as inf, as in other JSON parsers; the field checks refuse non-finite numbers where they matter.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

__all__ = ["MAX_DEPTH", "JsonBodyError", "loads"]

MAX_DEPTH = 128  # arrays and objects inside each other; a 64-level JSON schema (its own bound) fits
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # \ud800..\udfff: a pair or a lone one


class JsonBodyError(ValueError):
    """JSON text refused; the message says why (without the words "invalid JSON", which callers add)."""


def _constant(name: str) -> Any:
    raise JsonBodyError(f"{name} is not a JSON value (numbers must be finite)")


_DECODER = json.JSONDecoder(parse_constant=_constant)


def loads(data: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in `data` (UTF-8 bytes or text), or a JsonBodyError saying what is wrong with it."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonBodyError(f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    try:
        value = _DECODER.decode(data)
    except JsonBodyError:
        raise
    except RecursionError:
        raise JsonBodyError(f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise JsonBodyError(str(exc)) from None
    except ValueError:  # with these hooks, only the int-string conversion limit raises another ValueError
        raise JsonBodyError(f"an integer has more than {sys.get_int_max_str_digits()} digits") from None
    _check(value, max_depth, strings=_SURROGATE_ESCAPE.search(data) is not None)
    return value


def _check(value: Any, max_depth: int, *, strings: bool) -> None:
    """Refuse nesting deeper than `max_depth` and, when `strings`, a string (or key) with a lone surrogate.
    Iterative: the value may be nested as deep as the parser allowed."""
    if strings:
        _encodable(value)
    stack = [(value, 1)] if isinstance(value, list | dict) else []
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise JsonBodyError(f"nested deeper than {max_depth} levels")
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, list | dict):
                stack.append((child, depth + 1))
            elif strings:
                _encodable(child)
        if strings and isinstance(node, dict):
            for key in node:
                _encodable(key)


def _encodable(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise JsonBodyError(f"a string holds a lone UTF-16 surrogate (\\u{ord(value[exc.start]):04x}),"
                                " which is not Unicode text") from None
