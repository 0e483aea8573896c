"""The YAML front end: pipeline files, in spanflow's format and in the seed format.

spanflow's format has sections of steps, each with an ``id``, a ``type`` and ``to:``
(the ids it feeds)::

    name: sensor-alerts
    sources:
      - id: readings
        stream: SENSORS
        schema: {device: string, temperature: double, ts: timestamp}
        event_time: ts
        to: [valid]
    processors:
      - {id: valid, type: filter, where: "temperature > -50", to: [out]}
    sinks:
      - {id: out, type: console}

The seed format (the classic list-of-processors pipeline file, see
:mod:`spanflow.api.seed_format`) is a bare list of processors whose ``to:`` lists may
name ``sink``; the streams it reads and writes are given when it is loaded.

Every error names the file, the line and the field (``pipeline.yaml:12:
processors[0].where: ...``). The file is read with ``yaml.safe_load`` semantics: no
Python objects are ever constructed from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spanflow.api.registry import with_registry
from spanflow.api.seed_format import is_seed_format, seed_document
from spanflow.api.yaml_source import Path_, compose_located, field_text, line_for
from spanflow.errors import PipelineFileError
from spanflow.spec import PipelineSpec
from spanflow.spec.pipeline import StepInputError
from spanflow.spec.steps import STEP_TYPES
from spanflow.spec.steps.io import DEFAULT_CONNECTOR, SinkStep, SourceStep
from spanflow.spec.topology import Topology

Problems = list[tuple[int | None, str, str]]

_TOP_LEVEL = {
    "name",
    "sources",
    "processors",
    "sinks",
    "trigger",
    "mode",
    "dead_letter_stream",
    "dead_letter_retention",
    "standby",
}


def load_pipeline_text(
    text: str,
    path: str = "<string>",
    *,
    source_stream: str | None = None,
    sink_stream: str | None = None,
    bootstrap: str | None = None,
    topology: Topology | None = None,
) -> PipelineSpec:
    """Parse and validate a pipeline file's text into a spec.

    ``source_stream`` and ``sink_stream`` are the streams a seed-format file reads and
    writes (``bootstrap``: the Kafka brokers of one that names Kafka topics instead);
    spanflow's own format names its streams itself. With a ``topology``, sources and
    sinks inherit what they leave out from it (:mod:`spanflow.api.registry`)."""
    data, lines = compose_located(text, path)
    if is_seed_format(data):
        document, origin, problems = seed_document(
            data,
            lines,
            path,
            source_stream=source_stream,
            sink_stream=sink_stream,
            bootstrap=bootstrap,
        )
    else:
        if source_stream or sink_stream:
            raise PipelineFileError(
                path,
                [
                    (
                        1,
                        "",
                        "--source-stream/--sink-stream apply to seed-format files (a list of "
                        "processors); this file names its own sources and sinks",
                    )
                ],
            )
        document, origin, problems = _native_document(data, lines, path)
    if topology is not None:
        document, conflicts = with_registry(document, topology)
        for index, problem in conflicts:
            at = origin[index] if index < len(origin) else None
            problems.append((lines.get(at) if at else None, field_text(at or ()), problem))
    if problems:
        raise PipelineFileError(path, problems)
    return validated(document, origin, lines, path)


def _native_document(
    data: Any, lines: dict[Path_, int], path: str
) -> tuple[dict[str, Any], list[Path_ | None], Problems]:
    problems: Problems = []
    if not isinstance(data, dict):
        raise PipelineFileError(
            path, [(1, "", "a pipeline file must be a mapping (name:, sources:, ...)")]
        )
    for key in data:
        if key not in _TOP_LEVEL:
            allowed = ", ".join(sorted(_TOP_LEVEL))
            problems.append((lines.get((key,)), str(key), f"unknown section (allowed: {allowed})"))
    steps: list[dict[str, Any]] = []
    origin: list[Path_ | None] = []  # steps[i] came from this path in the file
    for section in ("sources", "processors", "sinks"):
        items = data.get(section) or []
        if not isinstance(items, list):
            problems.append((lines.get((section,)), section, "must be a list of steps"))
            continue
        for i, item in enumerate(items):
            at: Path_ = (section, i)
            if not isinstance(item, dict):
                problems.append(
                    (lines.get(at), field_text(at), "must be a mapping with id and type")
                )
                continue
            steps.append(_native_step(section, item, at, lines, path, problems))
            origin.append(at)
    _wire_native(data, steps, origin, lines, problems)
    document = {
        k: v for k, v in data.items() if k in _TOP_LEVEL - {"sources", "processors", "sinks"}
    }
    document["steps"] = steps
    return document, origin, problems


def _native_step(
    section: str,
    item: dict[str, Any],
    at: Path_,
    lines: dict[Path_, int],
    path: str,
    problems: Problems,
) -> dict[str, Any]:
    """A step as the spec reads it: a source's descriptor and Avro files read in."""
    step = dict(item)
    step.pop("to", None)
    if section == "sinks":
        return _connector_step(step, "sink", SinkStep)
    if section != "sources":
        return step
    step = _connector_step(step, "source", SourceStep)
    given = step.get("protobuf")
    if isinstance(given, dict) and isinstance(given.get("descriptors"), str):
        try:
            step["protobuf"] = {**given, "descriptors": read_descriptors(
                given["descriptors"], path)}  # fmt: skip
        except ValueError as exc:
            where = (*at, "protobuf", "descriptors")
            problems.append((lines.get(where), field_text(where), str(exc)))
    if isinstance(step.get("avro_schema"), str):
        try:
            step["avro_schema"] = read_avro_schema(step["avro_schema"], path)
        except ValueError as exc:
            where = (*at, "avro_schema")
            problems.append((lines.get(where), field_text(where), str(exc)))
    return step


def _wire_native(
    data: dict[str, Any],
    steps: list[dict[str, Any]],
    origin: list[Path_ | None],
    lines: dict[Path_, int],
    problems: Problems,
) -> None:
    """'to' lists become each downstream step's 'inputs'."""
    ids = {s.get("id"): n for n, s in enumerate(steps)}
    for n, step in enumerate(steps):
        here = origin[n]
        assert here is not None
        targets = data[str(here[0])][here[1]].get("to", [])
        if isinstance(targets, str):
            targets = [targets]
        at = (*here, "to")
        if not isinstance(targets, list):
            problems.append((lines.get(at), field_text(at), "must be a list of step ids"))
            continue
        for target in targets:
            if target not in ids:
                known = ", ".join(str(k) for k in ids)
                problems.append(
                    (lines.get(at), field_text(at), f"unknown step {target!r} (steps: {known})")
                )
                continue
            downstream = steps[ids[target]]
            downstream["inputs"] = [*downstream.get("inputs", []), step.get("id")]
        if here[0] == "sinks" and targets:
            problems.append((lines.get(at), field_text(at), "a sink has no downstream"))


def read_descriptors(given: str, pipeline_path: str) -> str:
    """A ``.desc`` file (a serialized FileDescriptorSet) as base64; text that is base64
    already (a spec written out and read again) is kept."""
    import base64

    if not given.endswith(".desc"):
        return given
    path = Path(given)
    if not path.is_absolute():
        path = Path(pipeline_path).parent / path
    try:
        return base64.b64encode(path.read_bytes()).decode()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None


def read_avro_schema(given: str, pipeline_path: str) -> dict[str, Any]:
    """An .avsc file's schema; a relative path is relative to the pipeline file."""
    path = Path(given)
    if not path.is_absolute():
        path = Path(pipeline_path).parent / path
    try:
        schema = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"{path} holds no Avro record schema")
    return schema


def _connector_step(
    item: dict[str, Any], step_type: str, cls: type[SourceStep] | type[SinkStep]
) -> dict[str, Any]:
    """A source or sink as written (``type: kafka``, its options beside the step's own
    fields) → the step: ``type`` names the connector, and every key that is not a field
    of the step is one of the connector's options."""
    step = dict(item)
    name = step.pop("type", DEFAULT_CONNECTOR)
    if name in ("nats", step_type):
        name = DEFAULT_CONNECTOR
    step["type"], step["connector"] = step_type, name
    own = {f.alias or n for n, f in cls.model_fields.items()} | set(cls.model_fields)
    options = {k: step.pop(k) for k in list(step) if k not in own and k != "to"}
    if options or "options" in step:
        step["options"] = {**(step.get("options") or {}), **options}
    return step


def validated(
    document: dict[str, Any], origin: list[Path_ | None], lines: dict[Path_, int], path: str
) -> PipelineSpec:
    """The spec of ``document``, or a PipelineFileError locating every problem in the file
    (``origin[i]`` is where ``document['steps'][i]`` came from; None for steps the
    loader added, which are located at the first step of the file)."""
    try:
        return PipelineSpec.model_validate(document)
    except ValidationError as exc:
        raise PipelineFileError(path, _located(exc, document, origin, lines)) from None


def _located(
    exc: ValidationError,
    document: dict[str, Any],
    origin: list[Path_ | None],
    lines: dict[Path_, int],
) -> Problems:
    problems: Problems = []
    errors = exc.errors()
    if any(len(e["loc"]) > 1 for e in errors):  # the step's own errors explain a short list
        errors = [e for e in errors if tuple(e["loc"]) != ("steps",)]
    ids = [s.get("id") if isinstance(s, dict) else None for s in document.get("steps", [])]
    for err in errors:
        loc = tuple(err["loc"])
        file_loc: Path_ = loc
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, StepInputError):
            index = _index_of(cause.step_id, ids)
            loc = ("steps", index) if index is not None else loc
        if loc and loc[0] == "steps" and len(loc) > 1 and isinstance(loc[1], int):
            rest = loc[3:] if len(loc) > 2 and loc[2] in STEP_TYPES else loc[2:]
            at = origin[loc[1]] if loc[1] < len(origin) else None
            if at is not None and at[0] in ("sources", "sinks"):
                rest = tuple("type" if p in ("kind", "connector") else p for p in rest)
                if rest[:1] == ("options",) and (*at, "options") not in lines:
                    rest = rest[1:]  # the option was written beside the step's fields
            if rest[:1] == ("inputs",):
                rest = ()
            if at is None:
                at = next((o for o in origin if o is not None), ())
                rest = ()
            file_loc = (*at, *rest)
        message = err["msg"].removeprefix("Value error, ")
        if message.startswith(("unknown source type", "unknown sink type")):
            file_loc = (*file_loc, "type")
        if err["type"] == "union_tag_invalid":
            message = (
                f"unknown type {err['input'].get('type')!r} (allowed: {', '.join(STEP_TYPES)})"
            )
            file_loc = (*file_loc, "type")
        problems.append((line_for(file_loc, lines), field_text(file_loc), message))
    return problems


def _index_of(step_id: str, ids: list[Any]) -> int | None:
    """The step ``step_id`` stands for (a step a sugar step expanded into is named
    ``<id>__<part>``)."""
    for candidate in (step_id, step_id.split("__")[0]):
        if candidate in ids:
            return ids.index(candidate)
    return None


def load_pipeline(
    path: str | Path,
    *,
    source_stream: str | None = None,
    sink_stream: str | None = None,
    bootstrap: str | None = None,
    topology: Topology | None = None,
) -> PipelineSpec:
    """Read a pipeline YAML (or JSON spec) file (``topology``: see
    :func:`load_pipeline_text`)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PipelineFileError(str(p), [(None, "", f"cannot read: {exc.strerror}")]) from None
    if p.suffix == ".json":
        return PipelineSpec.from_json(text)
    return load_pipeline_text(
        text,
        str(p),
        source_stream=source_stream,
        sink_stream=sink_stream,
        bootstrap=bootstrap,
        topology=topology,
    )
