"""A small JSON Schema validator for the tests (jsonschema is not a dependency): type, enum, const,
properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength, anyOf and
local $ref, which is what the structured-output tests use. Returns the first error, or None."""

from __future__ import annotations

from typing import Any

TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def _resolve(root: dict[str, Any], ref: str) -> Any:
    node: Any = root
    for part in filter(None, ref[1:].split("/")):
        node = node[part]
    return node


def schema_error(value: Any, schema: Any, root: Any = None, path: str = "$") -> str | None:
    root = schema if root is None else root
    if schema is True or schema == {}:
        return None
    if "$ref" in schema:
        return schema_error(value, _resolve(root, schema["$ref"]), root, path)
    if "anyOf" in schema:
        if all(schema_error(value, s, root, path) for s in schema["anyOf"]):
            return f"{path}: matches no anyOf branch"
        return None
    kind = schema.get("type")
    if kind is not None and not any(TYPES[k](value) for k in ([kind] if isinstance(kind, str) else kind)):
        return f"{path}: {value!r} is not {kind}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {value!r} not in {schema['enum']}"
    if "const" in schema and value != schema["const"]:
        return f"{path}: {value!r} != {schema['const']!r}"
    if isinstance(value, dict):
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return f"{path}: missing {missing}"
        props, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
        for key, item in value.items():
            sub = props.get(key, extra)
            if sub is False:
                return f"{path}: unexpected property {key!r}"
            error = schema_error(item, sub, root, f"{path}.{key}")
            if error:
                return error
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return f"{path}: {len(value)} items"
        for i, item in enumerate(value):
            error = schema_error(item, schema.get("items", True), root, f"{path}[{i}]")
            if error:
                return error
    if isinstance(value, str) and not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
        return f"{path}: length {len(value)}"
    return None
