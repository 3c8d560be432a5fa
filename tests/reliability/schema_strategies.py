"""Hypothesis strategies read off the server's own OpenAPI document (`GET /openapi.json`).

`valid(schema)` draws bodies the schema accepts; `broken(schema)` draws a
valid body with exactly one defect and names the error code the server must
answer with. Only the JSON Schema subset the server uses is understood (type,
enum, anyOf, properties/required/additionalProperties, min/max bounds,
minLength, items/minItems/maxItems); anything else fails loudly here, so a new
keyword in the server's schemas is noticed instead of silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

KNOWN_KEYWORDS = {"type", "enum", "anyOf", "properties", "required", "additionalProperties", "minimum", "maximum",
                  "exclusiveMinimum", "minLength", "items", "minItems", "maxItems"}
JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
SAMPLE_OF_TYPE: dict[str, Any] = {"object": {"x": 1}, "array": [1], "string": "x", "integer": 7,
                                  "number": 0.5, "boolean": True, "null": None}
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Follow a local `$ref` into the document's components."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def request_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return resolve(document, body)


def _types(schema: dict[str, Any]) -> list[str]:
    if "anyOf" in schema:
        return sorted({t for branch in schema["anyOf"] for t in _types(branch)})
    kinds = schema.get("type", list(JSON_TYPES))
    return [kinds] if isinstance(kinds, str) else list(kinds)


def valid(schema: dict[str, Any], fixed: dict[str, st.SearchStrategy] | None = None) -> st.SearchStrategy:
    """Values the schema accepts; `fixed` replaces the strategy of named top-level properties."""
    unknown = set(schema) - KNOWN_KEYWORDS
    if unknown:
        raise ValueError(f"schema keywords {sorted(unknown)} are not understood by the strategy builder")
    if "anyOf" in schema:
        return st.one_of([valid(branch) for branch in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    return st.one_of([_of_type(kind, schema, fixed or {}) for kind in _types(schema)])


def _of_type(kind: str, schema: dict[str, Any], fixed: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.text(st.characters(codec="utf-8"), min_size=schema.get("minLength", 0), max_size=40)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return st.floats(low, schema.get("maximum"), allow_nan=False, allow_infinity=False,
                         exclude_min="exclusiveMinimum" in schema)
    if kind == "array":
        return st.lists(valid(schema.get("items", {"type": "integer"})), min_size=schema.get("minItems", 0),
                        max_size=schema.get("maxItems", 6))
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        strategy = {name: fixed[name] if name in fixed else valid(sub) for name, sub in properties.items()}
        return st.fixed_dictionaries({k: v for k, v in strategy.items() if k in required},
                                     optional={k: v for k, v in strategy.items() if k not in required})
    raise ValueError(f"JSON type {kind!r} is not understood by the strategy builder")


@dataclass(frozen=True)
class Defect:
    """One thing wrong with a body, and the 400 code the server documents for it."""

    what: str
    code: str


DEFECTS = ("missing", "unknown", "wrong_type", "out_of_range")


def broken(schema: dict[str, Any], kind: str, fixed: dict[str, st.SearchStrategy] | None = None) -> st.SearchStrategy:
    """(body, Defect): a valid body with one top-level defect of `kind` (one of DEFECTS) and its 400 code."""
    properties = schema["properties"]
    required = sorted(schema.get("required", ()))
    bounded = sorted(n for n, s in properties.items() if {"minimum", "maximum"} & set(s) and "integer" in _types(s))

    @st.composite
    def draw(draw_: st.DrawFn) -> tuple[dict[str, Any], Defect]:
        body = dict(draw_(valid(schema, fixed)))
        if kind == "missing":
            name = draw_(st.sampled_from(required))
            body.pop(name, None)
            return body, Defect(f"without required {name!r}", "missing_required_parameter")
        if kind == "unknown":
            name = draw_(st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)
                         .filter(lambda n: n not in properties))
            body[name] = draw_(st.sampled_from(list(SAMPLE_OF_TYPE.values())))
            return body, Defect(f"unknown field {name!r}", "unknown_parameter")
        if kind == "wrong_type":
            name = draw_(st.sampled_from(sorted(properties)))
            allowed = set(_types(properties[name]))
            if "number" in allowed:
                allowed.add("integer")  # JSON Schema: every integer is a number
            wrong = draw_(st.sampled_from([t for t in JSON_TYPES if t not in allowed]))
            body[name] = SAMPLE_OF_TYPE[wrong]
            return body, Defect(f"{name!r} as {wrong}", "invalid_type")
        name = draw_(st.sampled_from(bounded))
        sub = properties[name]
        beyond = st.one_of(st.integers(1, 10), st.integers(1, 10**30), st.just(10**30))  # near, anywhere, absurd
        below = sub.get("minimum", 0) - draw_(beyond)
        above = sub.get("maximum", 0) + draw_(beyond)
        body[name] = draw_(st.sampled_from([v for v, limit in ((below, "minimum"), (above, "maximum"))
                                            if limit in sub]))
        return body, Defect(f"{name!r} = {body[name]} out of range", "invalid_value")

    return draw()
