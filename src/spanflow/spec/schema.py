"""Stream formats and record schemas.

A schema maps field names to types; a trailing ``?`` marks an optional field, which
may be missing or null. Everything else is required: a message without it is
dead-lettered, not silently filled with null.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator

FIELD_TYPES = {
    "string": "string",
    "str": "string",
    "long": "long",
    "int": "long",
    "integer": "long",
    "double": "double",
    "float": "double",
    "bool": "boolean",
    "boolean": "boolean",
    "timestamp": "timestamp",
    "binary": "binary",
}
"""Accepted spellings, mapped to the canonical name used in specs and Spark DDL."""


class StreamFormat(StrEnum):
    """How a message's bytes encode one record."""

    JSON = "json"
    YAML = "yaml"
    TOML = "toml"
    CSV = "csv"
    AVRO = "avro"
    PROTOBUF = "protobuf"
    RAW = "raw"


def _check_schema(schema: dict[str, str]) -> dict[str, str]:
    canonical: dict[str, str] = {}
    for name, declared in schema.items():
        if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ValueError(
                f"field name {name!r} must be letters, digits and '_' and not start with a digit"
            )
        if name.startswith("_"):
            raise ValueError(f"field name {name!r}: names starting with '_' are reserved")
        base = declared.strip()
        optional = base.endswith("?")
        base = base.rstrip("?").strip().lower()
        if base not in FIELD_TYPES:
            allowed = ", ".join(sorted(set(FIELD_TYPES.values())))
            raise ValueError(f"field {name!r}: unknown type {declared!r} (allowed: {allowed})")
        canonical[name] = FIELD_TYPES[base] + ("?" if optional else "")
    return canonical


Schema = Annotated[dict[str, str], AfterValidator(_check_schema)]
"""Field name → type (``string``, ``long``, ``double``, ``boolean``, ``timestamp``,
``binary``), optional when the type ends with ``?``."""


def field_type(declared: str) -> tuple[str, bool]:
    """(canonical type, optional) of one schema entry."""
    return declared.rstrip("?"), declared.endswith("?")


_JSON_VALUE_BYTES = {"string": 16, "long": 8, "double": 12, "boolean": 5, "timestamp": 26,
                     "binary": 24}  # fmt: skip
"""A typical value's length in JSON (a timestamp as ISO 8601 text, binary as base64)."""


def estimated_json_bytes(schema: dict[str, str]) -> int:
    """Roughly how many bytes one record of ``schema`` takes as a JSON object: each
    field's quoted name, a colon, a typical value and a comma, plus the braces. An
    estimate for planning (link bandwidth), not a limit.

    >>> estimated_json_bytes({"device": "string", "ts": "timestamp", "t": "double"})
    77
    """
    fields = sum(len(name) + 4 + _JSON_VALUE_BYTES.get(field_type(t)[0], 16)
                 for name, t in schema.items())  # fmt: skip
    return 2 + fields


SPARK_TYPES_BY_NAME = {
    "string": "string",
    "long": "bigint",
    "double": "double",
    "boolean": "boolean",
    "timestamp": "timestamp",
    "binary": "binary",
}
"""Canonical field type → Spark SQL DDL type."""
