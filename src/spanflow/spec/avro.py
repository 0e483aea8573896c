"""Avro payloads: what a source needs to know to read them, without any I/O.

A source with ``format: avro`` carries the writer's schema (an Avro ``record``) in
its spec, and its framing: ``plain`` (each message is the record's Avro binary
encoding) or ``confluent`` (Confluent's wire format: a zero byte, the schema id in 4
bytes, then the Avro binary). Without a ``schema`` of its own the source's fields and
types follow from the Avro record (:func:`fields_of`).
"""

from __future__ import annotations

from typing import Any

_PRIMITIVES = {
    "string": "string",
    "int": "long",
    "long": "long",
    "float": "double",
    "double": "double",
    "boolean": "boolean",
    "bytes": "binary",
}
_TIME_TYPES = {"timestamp-millis", "timestamp-micros", "local-timestamp-millis",
               "local-timestamp-micros"}  # fmt: skip


def field_names(schema: dict[str, Any]) -> list[str]:
    """The names of an Avro record's fields (a ValueError if it is not a record)."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ValueError("avro_schema must be an Avro record (type: record, fields: [...])")
    return [str(f.get("name")) for f in schema.get("fields", []) if isinstance(f, dict)]


def fields_of(schema: dict[str, Any]) -> dict[str, str]:
    """spanflow field types of an Avro record's fields (a ValueError naming the field
    whose type has no counterpart). ``["null", T]`` is an optional ``T``.

    >>> fields_of({"type": "record", "name": "R", "fields": [
    ...     {"name": "device", "type": "string"},
    ...     {"name": "t", "type": ["null", "double"]},
    ...     {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]})
    {'device': 'string', 't': 'double?', 'ts': 'timestamp'}
    """
    field_names(schema)
    out = {}
    for field in schema.get("fields", []):
        name = field.get("name")
        kind, optional = _type_of(field.get("type"))
        if kind is None:
            raise ValueError(
                f"avro field {name!r}: type {field.get('type')!r} has no spanflow counterpart "
                "(give the source a schema of the fields it needs)"
            )
        out[name] = kind + ("?" if optional else "")
    return out


def _type_of(avro: Any) -> tuple[str | None, bool]:
    if isinstance(avro, list):
        rest = [t for t in avro if t != "null"]
        if len(rest) != 1:
            return None, False
        kind, _ = _type_of(rest[0])
        return kind, len(rest) < len(avro)
    if isinstance(avro, dict):
        if avro.get("logicalType") in _TIME_TYPES:
            return "timestamp", False
        if avro.get("type") == "enum":
            return "string", False
        return _type_of(avro.get("type"))
    return _PRIMITIVES.get(avro) if isinstance(avro, str) else None, False
