"""Validate a value against one of the JSON Schema files beside this module, without a dependency.

The schema files are the contract (docs/topics.md); a consumer that acts on a record
checks it against the file itself, not against a copy of its rules. This is a small
interpreter of the keywords the decision and eviction files use (draft 2020-12): `type`, `required`,
`properties`, `additionalProperties`, `items`, `enum`, `const`, `minimum`,
`minLength`, `minItems`, `minProperties`, `pattern`, `format: date-time`, `not`,
`if`/`then`, plus the annotations (`description`, `title`, `$schema`, `$id`). A schema
using any other keyword is refused when it is loaded (`UnknownKeyword`), so a constraint
added to a file is never silently skipped here.

Two readings are stricter than JSON Schema's, because the consumers rely on Python
types: `integer` is an int (not 1.0, not a bool), `number` an int or float (not a bool).
A pattern's trailing `$` means the end of the string (Python's `$` also matches before
a trailing newline). Work is bounded by the schema's depth, not the value's: a value
nested deeper than the schema describes is not walked.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "examples", "default"})
KEYWORDS = frozenset(
    {
        "type",
        "required",
        "properties",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "minimum",
        "minLength",
        "minItems",
        "minProperties",
        "pattern",
        "format",
        "not",
        "if",
        "then",
    }
)
# RFC 3339 date-time (what `format: date-time` means): date, T, time, optional fraction, offset.
_DATE_TIME = re.compile(
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)"
    r"(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)\Z"
)
# How much of a value an error message quotes.
_SHOWN = 60


class UnknownKeyword(ValueError):
    """A schema file uses a keyword this interpreter does not implement."""


Schema = Mapping[str, Any]


@functools.cache
def load(name: str) -> Schema:
    """A schema file of this directory (e.g. `decisions.schema.json`), checked for known keywords."""
    schema: Schema = json.loads((HERE / name).read_text())
    _check_keywords(schema, name)
    return schema


def _check_keywords(schema: Any, where: str) -> None:
    if not isinstance(schema, Mapping):
        raise UnknownKeyword(f"{where}: a schema must be an object")
    for keyword, value in schema.items():
        if keyword in ANNOTATIONS:
            continue
        if keyword not in KEYWORDS:
            raise UnknownKeyword(f"{where}: keyword {keyword!r} is not implemented")
        if keyword == "properties":
            for name, sub in value.items():
                _check_keywords(sub, f"{where}.{name}")
        elif keyword in ("additionalProperties", "items", "not", "if", "then") and not isinstance(
            value, bool
        ):
            _check_keywords(value, f"{where}/{keyword}")
        elif keyword == "format" and value != "date-time":
            raise UnknownKeyword(f"{where}: format {value!r} is not implemented")


def problem(value: Any, schema: Schema, path: str = "") -> str | None:
    """Why `value` does not conform to `schema`, or None; the first problem found, with its path."""
    where = path or "record"
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        return f"{where} must be {_article(kind)}, not {_type_name(value)}"
    if "const" in schema and not _same(value, schema["const"]):
        return f"{where} must be {_show(schema['const'])}, not {_show(value)}"
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        return f"{where} must be one of {', '.join(_show(o) for o in schema['enum'])}, not {_show(value)}"
    if isinstance(value, str):
        found = _string_problem(value, schema, where)
        if found:
            return found
    if _is_number(value) and "minimum" in schema and value < schema["minimum"]:
        return f"{where} must be at least {schema['minimum']}, not {_show(value)}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return f"{where} needs at least {schema['minItems']} item(s)"
        items = schema.get("items")
        if items is not None:
            for i, item in enumerate(value):
                found = _sub(item, items, f"{path}[{i}]")
                if found:
                    return found
    if isinstance(value, dict):
        found = _object_problem(value, schema, path, where)
        if found:
            return found
    if "not" in schema and _sub(value, schema["not"], path) is None:
        return f"{where} must not match {_describe(schema['not'])}"
    if "if" in schema and _sub(value, schema["if"], path) is None and "then" in schema:
        found = _sub(value, schema["then"], path)
        if found:
            return found
    return None


def _sub(value: Any, schema: Schema | bool, path: str) -> str | None:
    if schema is True:
        return None
    if schema is False:
        return f"{path or 'record'} is not allowed"
    return problem(value, schema, path)


def _string_problem(value: str, schema: Schema, where: str) -> str | None:
    if len(value) < schema.get("minLength", 0):
        return f"{where} needs at least {schema['minLength']} character(s)"
    pattern = schema.get("pattern")
    if pattern is not None and _compiled(pattern).search(value) is None:
        return f"{where} does not match {pattern}"
    if schema.get("format") == "date-time" and _DATE_TIME.fullmatch(value) is None:
        return f"{where} is not an RFC 3339 date-time: {_show(value)}"
    return None


def _object_problem(value: dict[Any, Any], schema: Schema, path: str, where: str) -> str | None:
    for name in schema.get("required", ()):
        if name not in value:
            return f"{where} lacks {name}"
    if len(value) < schema.get("minProperties", 0):
        return f"{where} needs at least {schema['minProperties']} member(s)"
    properties: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name, member in value.items():
        inner = f"{path}.{name}" if path else str(name)
        found = _sub(member, properties.get(name, extra), inner)
        if found:
            return found
    return None


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"  # ECMA-262's `$`: the end, not before a trailing newline
    return re.compile(pattern)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_type(value: Any, kind: str | list[str]) -> bool:
    """Is `value` of the JSON Schema `type` `kind` (integers as integers, never a bool)?"""
    return _is_type(value, kind)


def _is_type(value: Any, kind: str | list[str]) -> bool:
    if isinstance(kind, list):
        return any(_is_type(value, k) for k in kind)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return _is_number(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    return isinstance(value, _TYPES[kind])


_TYPES: dict[str, type] = {"object": dict, "array": list, "string": str}


def _same(value: Any, expected: Any) -> bool:
    """JSON equality where a bool is never a number (True == 1 in Python)."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return isinstance(value, bool) and isinstance(expected, bool) and value == expected
    return bool(type(value) is type(expected) and value == expected) or (
        _is_number(value) and _is_number(expected) and value == expected
    )


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _article(kind: str | list[str]) -> str:
    if isinstance(kind, list):
        return " or ".join(_article(k) for k in kind)
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _describe(schema: Any) -> str:
    if isinstance(schema, Mapping) and set(schema) == {"required"}:
        return f"having all of {', '.join(schema['required'])}"
    return "the excluded shape"


def _show(value: Any) -> str:
    if isinstance(value, dict | list):
        return _type_name(value)
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
