"""The YAML front end: pipeline files in the seed style (processors with id, type, to).

::

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

Every error names the file, the line and the field (``pipeline.yaml:12:
processors[0].where: ...``). The file is read with ``yaml.safe_load`` semantics: no
Python objects are ever constructed from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spanflow.api.yaml_source import Path_, compose_located, field_text, line_for
from spanflow.errors import PipelineFileError
from spanflow.spec import PipelineSpec
from spanflow.spec.steps import STEP_TYPES

_TOP_LEVEL = {
    "name",
    "sources",
    "processors",
    "sinks",
    "trigger",
    "dead_letter_stream",
    "dead_letter_retention",
}


def load_pipeline_text(text: str, path: str = "<string>") -> PipelineSpec:
    """Parse and validate a pipeline file's text into a spec."""
    data, lines = compose_located(text, path)
    problems: list[tuple[int | None, str, str]] = []
    if not isinstance(data, dict):
        raise PipelineFileError(
            path, [(1, "", "a pipeline file must be a mapping (name:, sources:, ...)")]
        )
    for key in data:
        if key not in _TOP_LEVEL:
            problems.append(
                (
                    lines.get((key,)),
                    str(key),
                    f"unknown section (allowed: {', '.join(sorted(_TOP_LEVEL))})",
                )
            )
    steps: list[dict[str, Any]] = []
    origin: list[Path_] = []  # steps[i] came from this path in the file
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
            step = dict(item)
            step.pop("to", None)
            if section == "sources":
                step["type"] = step.get("type", "source")
                if step["type"] in ("jetstream", "nats"):
                    step["type"] = "source"
            elif section == "sinks":
                step["kind"] = step.pop("type", "jetstream")
                step["type"] = "sink"
            steps.append(step)
            origin.append(at)

    # 'to' lists become each downstream step's 'inputs'.
    ids = {s.get("id"): n for n, s in enumerate(steps)}
    for n, step in enumerate(steps):
        at = origin[n]
        item = data[at[0]][at[1]]
        targets = item.get("to", [])
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, list):
            problems.append(
                (lines.get((*at, "to")), field_text((*at, "to")), "must be a list of step ids")
            )
            continue
        for target in targets:
            if target not in ids:
                known = ", ".join(str(k) for k in ids)
                problems.append(
                    (
                        lines.get((*at, "to")),
                        field_text((*at, "to")),
                        f"unknown step {target!r} (steps: {known})",
                    )
                )
                continue
            downstream = steps[ids[target]]
            downstream["inputs"] = [*downstream.get("inputs", []), step.get("id")]
        if at[0] == "sinks" and targets:
            problems.append(
                (lines.get((*at, "to")), field_text((*at, "to")), "a sink has no downstream")
            )
    if problems:
        raise PipelineFileError(path, problems)

    document = {
        k: v for k, v in data.items() if k in _TOP_LEVEL - {"sources", "processors", "sinks"}
    }
    document["steps"] = steps
    try:
        return PipelineSpec.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors()
        if any(len(e["loc"]) > 1 for e in errors):  # the step's own errors explain a short list
            errors = [e for e in errors if tuple(e["loc"]) != ("steps",)]
        for err in errors:
            loc = tuple(err["loc"])
            file_loc: Path_ = loc
            if loc and loc[0] == "steps" and len(loc) > 1 and isinstance(loc[1], int):
                rest = loc[3:] if len(loc) > 2 and loc[2] in STEP_TYPES else loc[2:]
                if origin[loc[1]][0] == "sinks":
                    rest = tuple("type" if p == "kind" else p for p in rest)
                if rest[:1] == ("inputs",):
                    rest = ()
                file_loc = (*origin[loc[1]], *rest)
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "union_tag_invalid":
                message = (
                    f"unknown type {err['input'].get('type')!r} (allowed: {', '.join(STEP_TYPES)})"
                )
                file_loc = (*file_loc, "type")
            problems.append((line_for(file_loc, lines), field_text(file_loc), message))
        raise PipelineFileError(path, problems) from None


def load_pipeline(path: str | Path) -> PipelineSpec:
    """Read a pipeline YAML (or JSON spec) file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PipelineFileError(str(p), [(None, "", f"cannot read: {exc.strerror}")]) from None
    if p.suffix == ".json":
        return PipelineSpec.from_json(text)
    return load_pipeline_text(text, str(p))
