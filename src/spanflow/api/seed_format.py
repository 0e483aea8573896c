"""The seed pipeline format: the classic list-of-processors file, loaded as is.

::

    - id: in
      type: forward
      to: [total, how_many]
    - id: total
      type: sum
      to: [sink]
    - id: how_many
      type: count
      to: [avg]
    - id: avg
      type: average
      to: [sink]

Each entry has an ``id``, a ``type`` and ``to:`` (the entries it feeds; ``sink`` is
the output). Entries nothing feeds read the input. An entry fed by two or more
entries reads their union. The input and output are JetStream streams given when
the file is loaded (``spanflow run pipeline.yaml --source-stream S --sink-stream T``);
the input's messages are numbers (``42``) or records with a numeric ``value``.

The classic processors work on the fields ``value``, ``key`` and ``time`` (the
record's own, else when its source stored it), as the format describes them:
``forward`` passes records on; ``sum`` adds a constant (``value:``, default 1);
``count`` passes each record on with ``value`` set to the count of its key's records
so far; ``average`` writes the average ``value`` per key and tumbling window of
event time (``window:``, default :data:`DEFAULT_AVERAGE_WINDOW`). The running
aggregates of the whole stream that spanflow 0.1 ran for them are ``running_sum``,
``running_count`` and ``running_average``; a file using a bare classic processor
loads with a :class:`~spanflow.errors.MeaningChanged` warning that says so. Any other
spanflow step type may appear too, and spanflow's parameters override the defaults.
Errors name the file, line and field, as for spanflow's own format.
"""

from __future__ import annotations

import re
import warnings
from pathlib import PurePath
from typing import Any

from spanflow.api.yaml_source import Path_, field_text
from spanflow.errors import MeaningChanged
from spanflow.spec.steps import derived_id
from spanflow.spec.steps.classic import DEFAULT_AVERAGE_WINDOW

Problems = list[tuple[int | None, str, str]]

SINK = "sink"
SOURCE = "source"
SEED_SCHEMA = {"value": "double", "key": "string?", "time": "timestamp?"}
_MAPPING_KEYS = {
    "name",
    "processors",
    "trigger",
    "dead_letter_stream",
    "dead_letter_retention",
    *("source_topic", "sink_topic", "bootstrap", "parallelism"),
}
_KAFKA_KEYS = ("source_topic", "sink_topic", "bootstrap", "parallelism")
TIME = "time"
"""The field that carries each record's event time through the classic processors:
the record's own ``time`` where it has one, else when its source stored it."""


FIELDS = "source__fields"
"""The step after the source that sets ``time`` (the record's own, else when it was
stored) and, from Kafka, ``key`` (the record's Kafka key; the output record's key)."""
STORED_TIME = "coalesce(`time`, `_published`)"


def is_seed_format(data: Any) -> bool:
    """A bare list of processors, or a mapping with processors and no sources/sinks."""
    if isinstance(data, list):
        return True
    return isinstance(data, dict) and "processors" in data and not {"sources", "sinks"} & set(data)


def seed_document(
    data: Any,
    lines: dict[Path_, int],
    path: str,
    *,
    source_stream: str | None,
    sink_stream: str | None,
    bootstrap: str | None = None,
) -> tuple[dict[str, Any], list[Path_ | None], Problems]:
    """The pipeline document a seed file stands for, where each step came from, and
    the problems found (each located in the file). ``bootstrap`` overrides the Kafka
    brokers of a file that names ``source_topic`` and ``sink_topic``."""
    problems: Problems = []
    items, base, document, kafka = _sections(data, lines, problems)
    on_kafka = "source_topic" in kafka or "sink_topic" in kafka
    if bootstrap:
        kafka["bootstrap"] = bootstrap
    if on_kafka:
        problems += _kafka_problems(kafka, lines, source_stream or sink_stream)
    elif not source_stream or not sink_stream:
        problems.append(
            (
                1,
                "",
                "a seed-format pipeline (a list of processors) reads the stream given by "
                "--source-stream and writes the one given by --sink-stream (or the Kafka "
                "topics given by source_topic and sink_topic): give both",
            )
        )
    document.setdefault("name", _name_from(path))
    steps, origin, targets_of, where = _processors(items, base, lines, problems)
    _warn_changed_meaning(items, base, lines, path)
    inputs = _inputs(targets_of, where, lines, problems)
    if SINK not in inputs and not problems:
        problems.append((1, "", "no processor sends its output to 'sink'"))
    unions: list[tuple[dict[str, Any], Path_ | None]] = []
    first = FIELDS
    for step, step_at in zip(steps, origin, strict=True):
        feeds = inputs.get(step["id"]) or [first]
        step["inputs"], union = _joined(step["id"], feeds, step.get("type") == "union")
        if union is not None:
            unions.append((union, step_at))
    sink_inputs, sink_union = _joined(SINK, inputs.get(SINK, []), False)
    first_sink = next((where[s] for s in inputs.get(SINK, [])), None)
    if sink_union is not None:
        unions.append((sink_union, first_sink))
    if on_kafka:
        source, sink, ends = _kafka_ends(kafka)
    else:
        source, sink, ends = _stream_ends(source_stream, sink_stream)
    sink["inputs"] = sink_inputs
    document["steps"] = [source, *ends, *steps, *(u for u, _ in unions), sink]
    origin = [None, *(None for _ in ends), *origin, *(at for _, at in unions), first_sink]
    return document, origin, problems


def _sections(
    data: Any, lines: dict[Path_, int], problems: Problems
) -> tuple[list[Any], Path_, dict[str, Any], dict[str, Any]]:
    """A file's processors, where they are, its other keys and its Kafka keys."""
    if isinstance(data, list):
        return data, (), {}, {}
    items, base = data.get("processors") or [], ("processors",)
    document = {k: v for k, v in data.items() if k != "processors" and k not in _KAFKA_KEYS}
    kafka = {k: data[k] for k in _KAFKA_KEYS if k in data}
    for key in data:
        if key not in _MAPPING_KEYS:
            allowed = ", ".join(sorted(_MAPPING_KEYS))
            problems.append((lines.get((key,)), str(key), f"unknown section (allowed: {allowed})"))
    if not isinstance(items, list):
        problems.append((lines.get(base), "processors", "must be a list of processors"))
        items = []
    return items, base, document, kafka


def _processors(
    items: list[Any], base: Path_, lines: dict[Path_, int], problems: Problems
) -> tuple[list[dict[str, Any]], list[Path_ | None], dict[str, list[str]], dict[str, Path_]]:
    """Each processor as a step, where it is, where it sends its output (by id)."""
    steps: list[dict[str, Any]] = []
    origin: list[Path_ | None] = []
    targets_of: dict[str, list[str]] = {}
    where: dict[str, Path_] = {}
    for i, item in enumerate(items):
        at: Path_ = (*base, i)
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            problems.append(
                (lines.get(at), field_text(at), "must be a mapping with an id and a type")
            )
            continue
        if item["id"] in (SOURCE, SINK):
            problems.append(
                (lines.get((*at, "id")), field_text((*at, "id")), f"{item['id']!r} is reserved")
            )
            continue
        targets = item.get("to", [])
        targets = [targets] if isinstance(targets, str) else targets
        if not isinstance(targets, list):
            problems.append(
                (lines.get((*at, "to")), field_text((*at, "to")), "must be a list of ids")
            )
            targets = []
        targets_of[item["id"]] = [str(t) for t in targets]
        where[item["id"]] = at
        steps.append(_translate(item))
        origin.append(at)
    return steps, origin, targets_of, where


def _inputs(
    targets_of: dict[str, list[str]],
    where: dict[str, Path_],
    lines: dict[Path_, int],
    problems: Problems,
) -> dict[str, list[str]]:
    """Each processor's (and the sink's) inputs, from where the others send theirs."""
    known = set(targets_of) | {SINK}
    inputs: dict[str, list[str]] = {}
    for sender, targets in targets_of.items():
        for target in targets:
            if target in known:
                inputs.setdefault(target, []).append(sender)
                continue
            at = (*where[sender], "to")
            listed = ", ".join(sorted(known))
            problems.append(
                (
                    lines.get(at),
                    field_text(at),
                    f"unknown processor {target!r} (processors: {listed})",
                )
            )
    return inputs


def _stream_ends(
    source_stream: str | None, sink_stream: str | None
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The JetStream source and sink of a file run with --source-stream/--sink-stream."""
    source = {
        "id": SOURCE,
        "type": "source",
        "stream": source_stream or "SOURCE",
        "subjects": [source_stream or "SOURCE"],
        "schema": dict(SEED_SCHEMA),
        "scalar_field": "value",
    }
    out = sink_stream or "SINK"
    fields = {"id": FIELDS, "type": "map", "columns": {TIME: STORED_TIME}, "inputs": [SOURCE]}
    return (
        source,
        {"id": SINK, "type": "sink", "connector": "jetstream", "stream": out, "subject": out},
        [fields],
    )


def _kafka_problems(kafka: dict[str, Any], lines: dict[Path_, int], streams: Any) -> Problems:
    problems: Problems = []
    for key in ("source_topic", "sink_topic", "bootstrap"):
        if not isinstance(kafka.get(key), str):
            problems.append(
                (lines.get((key,), 1), key, "required when the pipeline runs between Kafka topics")
            )
    parallelism = kafka.get("parallelism", 1)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        problems.append(
            (lines.get(("parallelism",)), "parallelism", "a number of partitions, 1 or more")
        )
    if streams:
        problems.append(
            (1, "", "--source-stream/--sink-stream: this file runs between Kafka topics")
        )
    return problems


def _kafka_ends(kafka: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """A Kafka source and sink, topics created with ``parallelism`` partitions when
    missing; the record key travels in the field ``key`` so that each key's records
    leave in the order they came, on one partition."""
    common = {"bootstrap": kafka.get("bootstrap"), "partitions": kafka.get("parallelism", 1)}
    source = {
        "id": SOURCE,
        "type": "source",
        "connector": "kafka",
        "options": {"topic": kafka.get("source_topic"), **common},
        "schema": dict(SEED_SCHEMA),
        "scalar_field": "value",
    }
    columns = {"key": "_key", TIME: STORED_TIME}
    keyed = {"id": FIELDS, "type": "map", "columns": columns, "inputs": [SOURCE]}
    sink = {
        "id": SINK,
        "type": "sink",
        "connector": "kafka",
        "options": {"topic": kafka.get("sink_topic"), "key": "key", **common},
    }
    return source, sink, [keyed]


RUNNING = {"running_sum": "sum", "running_count": "count", "running_average": "avg"}
"""The running aggregates of ``value`` over the whole stream, by the names the seed
format leaves free (spanflow before 0.2 ran these for a bare sum, count and average)."""

_OLD_MEANING = {
    "sum": ("adds 1 (or its value:) to value, record by record", "running_sum"),
    "count": ("counts each key's records (the field key)", "running_count"),
    "average": (
        f"averages value per key and {DEFAULT_AVERAGE_WINDOW:g}-second window "
        "(or its window:), one record per window",
        "running_average",
    ),
}


def _warn_changed_meaning(
    items: list[Any], base: Path_, lines: dict[Path_, int], path: str
) -> None:
    """One warning naming each bare classic processor, whose meaning changed: spanflow
    0.1 ran running aggregates over the whole stream for them."""
    found = []
    for i, item in enumerate(items):
        kind = item.get("type") if isinstance(item, dict) else None
        if (
            not isinstance(kind, str)
            or kind not in _OLD_MEANING
            or set(item) - {"id", "type", "to"}
        ):
            continue
        meaning, running = _OLD_MEANING[kind]
        line = lines.get((*base, i, "type")) or lines.get((*base, i))
        found.append(
            f"{path}:{line}: {item.get('id')}: {kind} {meaning}, as the seed format says; "
            f"spanflow 0.1 gave the running {kind} of the whole stream here: "
            f"write type: {running} for that"
        )
    if found:
        found.append(
            "(a processor given a parameter — sum value:, count key:, average window: — "
            "means the new meaning, and is not warned about)"
        )
        warnings.warn("\n".join(found), MeaningChanged, stacklevel=4)


def _translate(item: dict[str, Any]) -> dict[str, Any]:
    """A seed entry as a spanflow step: the classic processors as the format describes
    them, on the fields ``value``, ``key`` and ``time``; spanflow's own parameters
    (``field``, ``key``, ``window`` …) override these defaults."""
    step = {k: v for k, v in item.items() if k != "to"}
    kind = step.get("type")
    if not isinstance(kind, str):
        return step
    if kind in RUNNING:
        step["type"] = "running"
        step["fn"] = RUNNING[str(kind)]
    elif kind == "count" and "key" not in step:
        step.update(key="key", emit="records", output="value")
        step.update({k: v for k, v in item.items() if k in ("emit", "output")})
    elif kind == "average":
        defaults = {
            "field": "value",
            "key": "key",
            "window": DEFAULT_AVERAGE_WINDOW,
            "output": "value",
            "time": TIME,
        }
        step = {**defaults, **step}
    return step


def _joined(
    step_id: str, feeds: list[str], is_union: bool
) -> tuple[list[str], dict[str, Any] | None]:
    """A step's inputs: several feeds go through a union first (unless it is one)."""
    if len(feeds) <= 1 or is_union:
        return feeds, None
    union_id = derived_id(step_id, "union")
    union = {"id": union_id, "type": "union", "inputs": feeds, "allow_missing": True}
    return [union_id], union


def _name_from(path: str) -> str:
    stem = PurePath(path).stem if path and not path.startswith("<") else "pipeline"
    name = re.sub(r"[^A-Za-z0-9_-]", "-", stem).strip("-_") or "pipeline"
    return name if name[0].isalnum() else f"p{name}"
