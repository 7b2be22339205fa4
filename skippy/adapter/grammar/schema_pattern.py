"""JSON Schema `pattern` -> a regular expression the GBNF converter translates faithfully, or a refusal.

llama-cpp-python's converter copies regex text into GBNF almost verbatim, so `\\d`, `.` or `[^...]`
would either fail to parse or let the model write characters a JSON string must escape (`"`, `\\`,
control characters), and the output would not parse. Only a safe subset is accepted, rewritten into
the forms GBNF understands: literals (no `"`, `\\` or control characters), classes of printable ASCII
without negation, `\\d` / `\\w` / escaped punctuation, groups (no `(?`), `|`, and the quantifiers
`* + ? {m} {m,} {m,n}`. Every string the result matches is a JSON string body needing no escape.
"""

from __future__ import annotations

import re

_UNSAFE = {'"', "\\"}
_META = set("()[]{}|*+?.^$")
_CLASS_ESCAPES = {"d": [("0", "9")], "w": [("a", "z"), ("A", "Z"), ("0", "9"), ("_", "_")]}
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")
SUPPORTED = ("literals, [classes] of printable ASCII without ^, \\d, \\w, escaped punctuation, (groups), |, "
             "* + ? {m} {m,} {m,n}")


class PatternError(ValueError):
    """The pattern uses something outside the supported subset; the message says what."""


def _safe_char(ch: str) -> bool:
    return ch not in _UNSAFE and ch >= " " and ch != "\x7f"


def _class_text(ranges: list[tuple[str, str]]) -> str:
    """Ranges back as a GBNF-friendly class: `-` last (literal there), nothing else special inside."""
    items = sorted(set(ranges))
    dash = ("-", "-") in items
    body = "".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in items if (lo, hi) != ("-", "-"))
    return "[" + body + ("-" if dash else "") + "]"


def _parse_class(pattern: str, i: int) -> tuple[str, int]:
    """The class starting after `[` at i: (its canonical text, the index after `]`)."""
    if i < len(pattern) and pattern[i] == "^":
        raise PatternError("a negated class [^...] can match characters a JSON string must escape")
    ranges: list[tuple[str, str]] = []
    while i < len(pattern) and pattern[i] != "]":
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt in _CLASS_ESCAPES:
                ranges += _CLASS_ESCAPES[nxt]
            elif nxt and nxt in _META | {"-", "/"}:
                ranges.append((nxt, nxt))
            else:
                raise PatternError(f"the escape \\{nxt} inside a class is not supported")
            i += 2
            continue
        if ch in "[^" or not _safe_char(ch) or not ch.isascii():
            raise PatternError(f"the character {ch!r} inside a class is not supported")
        if i + 2 < len(pattern) and pattern[i + 1] == "-" and pattern[i + 2] != "]":
            hi = pattern[i + 2]
            if not hi.isascii() or hi < ch or any(ch <= bad <= hi for bad in '"\\[]^') or not _safe_char(hi):
                raise PatternError(f"the range {ch}-{hi} is not a range of safe printable ASCII")
            ranges.append((ch, hi))
            i += 3
            continue
        ranges.append((ch, ch))
        i += 1
    if i >= len(pattern) or not ranges:
        raise PatternError("an unclosed or empty [class]")
    return _class_text(ranges), i + 1


def _escape(nxt: str) -> str:
    """An escape outside a class, as a literal or a class."""
    if nxt in _CLASS_ESCAPES:
        return _class_text(_CLASS_ESCAPES[nxt])
    if nxt in _META - {"^", "$"} or nxt in "-/":
        return _class_text([(nxt, nxt)]) if nxt not in "[]" else f"[\\{nxt}]"
    raise PatternError(f"the escape \\{nxt} is not supported")


def safe_pattern(pattern: str) -> str:
    """The pattern anchored as `^(...)$` in the supported subset; PatternError names what is not supported."""
    core = pattern[1:] if pattern.startswith("^") else pattern
    core = core[:-1] if core.endswith("$") and not core.endswith("\\$") else core
    out: list[str] = []
    i = 0
    while i < len(core):
        ch = core[i]
        if ch == "\\":
            out.append(_escape(core[i + 1 : i + 2]))
            i += 2
        elif ch == "[":
            text, i = _parse_class(core, i + 1)
            out.append(text)
        elif ch == "(":
            if core[i + 1 : i + 2] == "?":
                raise PatternError("(?...) groups (lookaround, non-capturing, named) are not supported")
            out.append(ch)
            i += 1
        elif ch == "{":
            match = _QUANTIFIER.match(core, i)
            if match is None or (match.group(3) and int(match.group(3)) < int(match.group(1))):
                raise PatternError("a {m,n} quantifier must be {m}, {m,} or {m,n} with m <= n")
            out.append(match.group(0))
            i = match.end()
        elif ch in ")|*+?":
            out.append(ch)
            i += 1
        elif ch in ".^$":
            raise PatternError(f"{ch!r} is not supported here ('.' can match characters a JSON string must escape)")
        elif not _safe_char(ch):
            raise PatternError(f"the character {ch!r} would need escaping in a JSON string")
        else:
            out.append(ch)
            i += 1
    if not out:
        raise PatternError("an empty pattern")
    return "^(" + "".join(out) + ")$"
