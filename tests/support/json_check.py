"""A small JSON Schema checker for the subset the structured-output tests use (jsonschema is not
installed): type, enum, const, properties/required/additionalProperties, items with
minItems/maxItems, string min/maxLength and pattern, number bounds and multipleOf, anyOf,
local $ref."""

from __future__ import annotations

import re
from typing import Any

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def errors(
    value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None, at: str = "$"
) -> list[str]:
    """Every way `value` breaks `schema`, as "path: reason" lines (empty when valid)."""
    root = schema if root is None else root
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return errors(value, target, root, at)
    if "anyOf" in schema and all(errors(value, s, root, at) for s in schema["anyOf"]):
        return [f"{at}: matches none of anyOf"]
    out: list[str] = []
    kind = schema.get("type")
    if kind is not None and not _TYPES[kind](value):
        return [f"{at}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{at}: {value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        out.append(f"{at}: {value!r} is not {schema['const']!r}")
    if isinstance(value, dict):
        out += _object(value, schema, root, at)
    elif isinstance(value, list):
        out += _array(value, schema, root, at)
    elif isinstance(value, str):
        out += _string(value, schema, at)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        out += _number(value, schema, at)
    return out


def _object(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], at: str) -> list[str]:
    props = schema.get("properties", {})
    out = [f"{at}: missing {k!r}" for k in schema.get("required", []) if k not in value]
    for key, item in value.items():
        if key in props:
            out += errors(item, props[key], root, f"{at}.{key}")
        elif schema.get("additionalProperties") is False:
            out.append(f"{at}: unexpected property {key!r}")
    return out


def _array(value: list[Any], schema: dict[str, Any], root: dict[str, Any], at: str) -> list[str]:
    out = []
    if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
        out.append(f"{at}: {len(value)} items is out of bounds")
    if "items" in schema:
        for i, item in enumerate(value):
            out += errors(item, schema["items"], root, f"{at}[{i}]")
    return out


def _string(value: str, schema: dict[str, Any], at: str) -> list[str]:
    out = []
    if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
        out.append(f"{at}: length {len(value)} is out of bounds")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        out.append(f"{at}: {value!r} does not match {schema['pattern']!r}")
    return out


def _number(value: float, schema: dict[str, Any], at: str) -> list[str]:
    low, high = schema.get("minimum", value), schema.get("maximum", value)
    out = [] if low <= value <= high else [f"{at}: {value} is not within [{low}, {high}]"]
    step = schema.get("multipleOf")
    if step is not None and abs(value / step - round(value / step)) > 1e-9:
        out.append(f"{at}: {value} is not a multiple of {step}")
    return out
