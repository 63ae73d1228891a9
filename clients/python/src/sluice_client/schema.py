"""Holds the package's records (`types.RECORDS`) to the server's OpenAPI document: each field
must be a property of the schema its record names, of a JSON type its annotation allows, and a
request record must carry every property its schema requires. A drift between the client and
the server (a field renamed, removed or retyped) is a list of lines here, and a failing test.
"""

from __future__ import annotations

import typing
from typing import Any, Union
import types as _pytypes

from . import types

_JSON_TYPES: dict[Any, set[str]] = {
    str: {"string"},
    int: {"integer"},
    float: {"number", "integer"},
    bool: {"boolean"},
    dict: {"object"},
    list: {"array"},
}


def _resolve(document: dict[str, Any], schema: Any) -> Any:
    """`schema` with its `$ref`s followed (local ones, `#/components/...`)."""
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"cannot follow the reference {ref}")
        node: Any = document
        for key in ref[2:].split("/"):
            node = node[key.replace("~1", "/").replace("~0", "~")]
        schema = node
        seen += 1
        if seen > 32:
            raise ValueError(f"the reference {ref} loops")
    return schema


def _variants(document: dict[str, Any], schema: Any) -> list[dict[str, Any]]:
    """The object schemas `schema` may be: itself, or each of its `oneOf`/`anyOf`/`allOf`."""
    schema = _resolve(document, schema)
    if not isinstance(schema, dict):
        return []
    found = [schema]
    for key in ("oneOf", "anyOf", "allOf"):
        for part in schema.get(key, []):
            found.extend(_variants(document, part))
    return found


def _walk(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The schema at `path`: keys from the root, `$ref`s followed on the way, a key missing
    from a union taken from the first of its variants that has it."""
    node: Any = document
    for index, key in enumerate(path):
        node = _resolve(document, node)
        if isinstance(node, dict) and key in node:
            node = node[key]
            continue
        candidates = [v[key] for v in _variants(document, node) if key in v]
        if not candidates:
            raise KeyError("/".join(path[: index + 1]))
        node = candidates[0]
    return _resolve(document, node)


def _property(document: dict[str, Any], schema: Any, name: str) -> Any:
    for variant in _variants(document, schema):
        props = variant.get("properties", {})
        if name in props:
            return props[name]
    return None


def _schema_types(document: dict[str, Any], schema: Any) -> set[str]:
    """Every JSON type `schema` admits; empty when it admits any."""
    found: set[str] = set()
    for variant in _variants(document, schema):
        kind = variant.get("type")
        if isinstance(kind, str):
            found.add(kind)
        elif isinstance(kind, list):
            found.update(kind)
        elif "properties" in variant or "additionalProperties" in variant:
            found.add("object")
        elif "enum" in variant:
            found.update({"string"} if all(isinstance(e, str) for e in variant["enum"]) else set())
        elif "$ref" not in variant and not any(k in variant for k in ("oneOf", "anyOf", "allOf")):
            return set()  # `{}` or a description alone: any value
    return found


def _hint_types(hint: Any) -> set[str] | None:
    """The JSON types a field's annotation takes; None for `Any`."""
    if hint is Any or hint is types.Json:
        return None
    origin = typing.get_origin(hint)
    if origin in (Union, _pytypes.UnionType):
        found: set[str] = set()
        for arg in typing.get_args(hint):
            if arg is type(None):
                found.add("null")
                continue
            sub = _hint_types(arg)
            if sub is None:
                return None
            found |= sub
        return found
    if isinstance(hint, type) and issubclass(hint, types.Record):
        return {"object"}
    base = origin or hint
    return set(_JSON_TYPES.get(base, set())) or None


def check(document: dict[str, Any]) -> list[str]:
    """Every disagreement between the records and `document`, one line each; empty when
    they agree."""
    problems: list[str] = []
    for record in types.RECORDS:
        where = "/".join(record.OPENAPI)
        try:
            schema = _walk(document, record.OPENAPI)
        except (KeyError, TypeError, ValueError) as error:
            problems.append(f"{record.__name__}: the document has no schema at {where} ({error})")
            continue
        fields = record.json_fields()
        for name, hint in fields.items():
            prop = _property(document, schema, name)
            if prop is None:
                problems.append(f"{record.__name__}.{name}: not a property of {where}")
                continue
            wanted = _hint_types(hint)
            offered = _schema_types(document, prop)
            if wanted is None or not offered:
                continue
            if not (wanted - {"null"}) & offered:
                problems.append(
                    f"{record.__name__}.{name}: the client takes {sorted(wanted)}, "
                    f"the server sends {sorted(offered)}"
                )
        if "requestBody" in record.OPENAPI:
            for variant in _variants(document, schema):
                for required in variant.get("required", []):
                    if required not in fields:
                        problems.append(
                            f"{record.__name__}: the server requires `{required}`, "
                            "which the client cannot send"
                        )
    return problems
