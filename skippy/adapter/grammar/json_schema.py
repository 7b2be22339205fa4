"""JSON Schemas -> llama.cpp GBNF whose every complete output validates against the schema.

llama-cpp-python's converter (`llama_cpp.llama_grammar.SchemaConverter`) writes the grammar, but it
silently drops keywords it does not enforce (`minimum`, `uniqueItems`, `oneOf`'s exclusivity, ...)
and picks one branch when keywords mix. So every schema is first checked and normalised here: each
node keeps only keywords the converter enforces exactly, annotations (`title`, `description`, ...)
are dropped, local `$ref`s are re-pointed at uniquely named `$defs` (so several schemas can share one
grammar), and anything else is refused with a `SchemaError` that names the part, e.g.
`response_format.json_schema.schema.properties.age.minimum` -- or, when the caller relaxes (tools, and
`response_format` without `strict`), dropped and recorded in `relaxed` (the value is then generated
without that constraint; a malformed schema is still refused). Strings are generated without raw
control characters (the converter's own `char` rule would allow them, which is not valid JSON).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from skippy.adapter.grammar.schema_pattern import SUPPORTED, PatternError, safe_pattern

ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated",
                         "readOnly", "writeOnly", "$defs", "definitions"})
PRIMITIVES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
ALLOWED = {  # keywords the converter enforces exactly, per type
    "object": {"type", "properties", "required", "additionalProperties"},
    "array": {"type", "items", "prefixItems", "minItems", "maxItems"},
    "string": {"type", "minLength", "maxLength", "pattern", "format"},
    "number": {"type"}, "integer": {"type"}, "boolean": {"type"}, "null": {"type"},
}
STRICT_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
MAX_DEPTH = 64
MAX_COUNT = 10_000  # minItems / maxItems / minLength / maxLength: more would not fit in a grammar anyway
_UNSUPPORTED = "is not supported (the grammar cannot enforce it exactly; anyOf, $ref and enum are)"


class SchemaError(ValueError):
    """A schema (part) the grammar cannot enforce exactly; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.detail = param, message


def _is_type(value: Any, name: str) -> bool:
    checks = {"object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
              "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "null": lambda v: v is None,
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool)}
    return checks[name](value)


class _Cleaner:
    """One schema document: normalises nodes, collecting referenced targets under unique `$defs` keys."""

    def __init__(self, root: Any, prefix: str, relax: bool, relaxed: dict[str, str]) -> None:
        self.root, self.prefix, self.relax, self.relaxed = root, prefix, relax, relaxed
        self.defs: dict[str, Any] = {}
        self._keys: dict[str, str] = {}  # JSON pointer -> defs key

    def _unsupported(self, path: str, keys: list[str], message: str) -> None:
        """Refuse `keys` (naming the first), or, relaxing, record them as generated without their constraint."""
        if keys and not self.relax:
            raise SchemaError(f"{path}.{keys[0]}", message)
        for key in keys:
            self.relaxed.setdefault(key, f"{path}.{key}")

    def _count(self, node: dict[str, Any], key: str, path: str) -> int | None:
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SchemaError(f"{path}.{key}", f"expected a non-negative integer, got {value!r}")
        if value is not None and value > MAX_COUNT:  # the converter spells out every repetition: bound it first
            self._unsupported(path, [key], f"must be at most {MAX_COUNT} (the grammar spells out each repetition)")
            return None
        return value

    def ref(self, pointer: Any, path: str) -> dict[str, Any]:
        if not isinstance(pointer, str) or not (pointer == "#" or pointer.startswith("#/")):
            raise SchemaError(f"{path}.$ref", f"only local references (#/...) are supported, got {pointer!r}")
        if pointer not in self._keys:
            key = self._keys[pointer] = f"{self.prefix}-ref{len(self._keys)}"
            target: Any = self.root
            for part in filter(None, pointer[1:].split("/")):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise SchemaError(f"{path}.$ref", f"{pointer!r} does not resolve")
                target = target[part]
            self.defs[key] = self.node(target, f"{path}.$ref({pointer})", 0)
        return {"$ref": f"#/$defs/{self._keys[pointer]}"}

    def node(self, node: Any, path: str, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise SchemaError(path, f"nested deeper than {MAX_DEPTH} levels")
        if node is True:
            return {"type": "object"}  # any value; an object is one
        if not isinstance(node, dict):
            raise SchemaError(path, f"expected a schema object, got {json.dumps(node)[:40]}")
        keys = {k for k in node if k not in ANNOTATIONS and not k.startswith("x-")}
        if self.relax and "oneOf" in keys and "anyOf" not in keys:  # generated as anyOf: exclusivity relaxed
            if not isinstance(node["oneOf"], list) or not node["oneOf"]:
                raise SchemaError(f"{path}.oneOf", "expected a non-empty list of schemas")
            self._unsupported(path, ["oneOf"], _UNSUPPORTED)
            node, keys = {**node, "anyOf": node["oneOf"]}, keys - {"oneOf"} | {"anyOf"}
        for combinator in ("$ref", "anyOf", "const", "enum"):
            if combinator in keys:
                extra = sorted(keys - {combinator, "type"} if combinator in ("const", "enum") else keys - {combinator})
                if extra:
                    self._unsupported(path, extra, f"cannot be combined with {combinator}")
                return self._combinator(node, combinator, path, depth)
        kind = node.get("type")
        if isinstance(kind, list):
            if not kind or any(k not in PRIMITIVES for k in kind) or (keys != {"type"} and not self.relax):
                raise SchemaError(f"{path}.type", "a list of types must name primitive types and stand alone")
            self._unsupported(path, sorted(keys - {"type"}), _UNSUPPORTED)
            return {"type": list(kind)}
        if kind is None:
            if not keys:
                return {"type": "object"}  # only annotations: any value; an object is one
            kind = next((k for k, allowed in ALLOWED.items() if keys <= allowed), None)
            if kind is None and self.relax:  # the type whose keywords it uses, else any value (an object is one)
                kind = next((k for k, allowed in ALLOWED.items() if keys & (allowed - {"type"})), "object")
            if kind is None:
                raise SchemaError(f"{path}.{sorted(keys)[0]}", _UNSUPPORTED)
        if kind not in ALLOWED:
            raise SchemaError(f"{path}.type", f"expected one of {sorted(PRIMITIVES)}, got {kind!r}")
        extra = sorted(keys - ALLOWED[kind])
        if extra:
            self._unsupported(path, extra, f"{_UNSUPPORTED} for type {kind}")
        build = {"object": self._object, "array": self._array, "string": self._string}.get(kind)
        return {"type": kind} if build is None else build(node, path, depth)

    def _combinator(self, node: dict[str, Any], key: str, path: str, depth: int) -> dict[str, Any]:
        if key == "$ref":
            return self.ref(node["$ref"], path)
        if key == "anyOf":
            options = node["anyOf"]
            if not isinstance(options, list) or not options:
                raise SchemaError(f"{path}.anyOf", "expected a non-empty list of schemas")
            return {"anyOf": [self.node(o, f"{path}.anyOf[{i}]", depth + 1) for i, o in enumerate(options)]}
        values = [node["const"]] if key == "const" else node["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{path}.enum", "expected a non-empty list")
        kinds = node.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds
        for value in values:
            if kinds is not None and not any(k in PRIMITIVES and _is_type(value, k) for k in kinds):
                raise SchemaError(f"{path}.{key}", f"{json.dumps(value)} is not of type {node['type']}")
        return {"enum": values}

    def _object(self, node: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        props = node.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(f"{path}.properties", "expected an object of schemas")
        required = node.get("required", [])
        if not isinstance(required, list) or any(not isinstance(r, str) for r in required):
            raise SchemaError(f"{path}.required", "expected a list of property names")
        missing = [r for r in required if r not in props]
        if missing:
            raise SchemaError(f"{path}.required", f"names {missing[0]!r}, which is not in properties")
        out: dict[str, Any] = {"type": "object", "required": list(dict.fromkeys(required)),
                               "properties": {k: self.node(v, f"{path}.properties.{k}", depth + 1)
                                              for k, v in props.items()}}
        extra = node.get("additionalProperties", False if props else True)
        if isinstance(extra, dict):
            extra = self.node(extra, f"{path}.additionalProperties", depth + 1)
        elif not isinstance(extra, bool):
            raise SchemaError(f"{path}.additionalProperties", "expected a boolean or a schema")
        if not props and extra is True:
            return {"type": "object"}
        out["additionalProperties"] = extra
        return out

    def _array(self, node: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        lo, hi = self._count(node, "minItems", path), self._count(node, "maxItems", path)
        if lo is not None and hi is not None and lo > hi:
            raise SchemaError(f"{path}.minItems", f"{lo} is over maxItems {hi}")
        tuple_items = node.get("prefixItems", node["items"] if isinstance(node.get("items"), list) else None)
        if tuple_items is not None:
            if not isinstance(tuple_items, list) or not tuple_items:
                raise SchemaError(f"{path}.prefixItems", "expected a non-empty list of schemas")
            open_parts = [k for k, v in (("minItems", lo), ("maxItems", hi)) if v is not None]
            if "prefixItems" in node and node.get("items", False) is not False:
                open_parts.append("items")
            if open_parts and not self.relax:
                raise SchemaError(f"{path}.prefixItems", "only a closed tuple (no items, minItems, maxItems) is supported")
            self._unsupported(path, open_parts, "")
            return {"type": "array", "prefixItems": [self.node(s, f"{path}.prefixItems[{i}]", depth + 1)
                                                     for i, s in enumerate(tuple_items)]}
        items = self.node(node.get("items", True), f"{path}.items", depth + 1)
        out: dict[str, Any] = {"type": "array", "items": items}
        out.update({k: v for k, v in (("minItems", lo), ("maxItems", hi)) if v is not None})
        return out

    def _string(self, node: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        groups = [g for g in ([k for k in group if k in node] for group in (("pattern",), ("format",),
                                                                              ("minLength", "maxLength"))) if g]
        if len(groups) > 1:  # relaxed: only the first is enforced
            dropped = [k for g in groups[1:] for k in g]
            self._unsupported(path, dropped, f"cannot be combined with {groups[0][0]}")
            node = {k: v for k, v in node.items() if k not in dropped}
        if "pattern" in node:
            try:
                return {"type": "string", "pattern": safe_pattern(str(node["pattern"]))}
            except PatternError as exc:
                self._unsupported(path, ["pattern"], f"{exc} (supported: {SUPPORTED})")
                return {"type": "string"}
        if "format" in node:
            if node["format"] in FORMATS:
                return {"type": "string", "format": node["format"]}
            self._unsupported(path, ["format"], f"{node['format']!r} is not supported (supported: {sorted(FORMATS)})")
            return {"type": "string"}
        lo, hi = self._count(node, "minLength", path), self._count(node, "maxLength", path)
        if lo is not None and hi is not None and lo > hi:
            raise SchemaError(f"{path}.minLength", f"{lo} is over maxLength {hi}")
        return {"type": "string", **{k: v for k, v in (("minLength", lo), ("maxLength", hi)) if v is not None}}


class GrammarBuilder:
    """Several schemas in one GBNF grammar: `rule_for(schema, name, path)` per schema, then `grammar(root)`."""

    def __init__(self) -> None:
        self._converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self.relaxed: dict[str, str] = {}  # keyword -> where it was first relaxed

    def rule_for(self, schema: Any, name: str, path: str, relax: bool = False) -> str:
        """The rule generating JSON values valid against `schema` (SchemaError names what is not supported;
        `relax`: what the grammar cannot enforce is dropped and recorded in `relaxed` instead)."""
        cleaner = _Cleaner(schema, name, relax, self.relaxed)
        doc = cleaner.node(schema, path, 0)
        # the cleaner's refs are all `#/$defs/<unique key>`: register them instead of the converter's
        # resolve_refs (which does not look inside a referenced schema, so misses nested refs)
        self._converter._refs.update({f"#/$defs/{key}": target for key, target in copy.deepcopy(cleaner.defs).items()})
        try:
            return str(self._converter.visit(copy.deepcopy(doc), name))
        except (AssertionError, ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
            raise SchemaError(path, f"the grammar converter cannot handle this schema ({exc})") from None

    def add(self, name: str, body: str) -> None:
        self._converter._rules[name] = body

    def grammar(self, root: str) -> str:
        rules = dict(self._converter._rules)
        if "char" in rules:
            rules["char"] = STRICT_CHAR
        rules["root"] = root
        return "\n".join(f"{name} ::= {body}" for name, body in sorted(rules.items())) + "\n"
