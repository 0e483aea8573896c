"""Read a topology file (sites, nodes, links) with errors that name file, line and field.

::

    name: two-factories
    sites:
      - {name: factory-a, kind: edge}
      - {name: cloud, kind: cloud}
    nodes:
      - name: a1
        site: factory-a
        local: true
        capabilities: {cores: 2, memory_mb: 2g, tags: [camera]}
        streams:
          - {name: SENSORS_A, subjects: ["sensors.a.>"], schema: {device: string}}
    links:
      - {between: [factory-a, cloud], latency: 30ms, bandwidth_mbps: 100}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spanflow.api.yaml_source import compose_located, located_problems
from spanflow.errors import TopologyFileError
from spanflow.spec.topology import Topology


def load_topology_text(text: str, path: str = "<string>") -> Topology:
    data, lines = compose_located(text, path, TopologyFileError)
    if not isinstance(data, dict):
        raise TopologyFileError(
            path, [(1, "", "a topology file must be a mapping (sites:, nodes:)")]
        )
    try:
        return Topology.model_validate(data)
    except ValidationError as exc:
        problems = located_problems(exc, lines)
        # Cross-reference errors (unknown site, duplicates) carry no location of their own:
        # point at the offending entry when the message names one.
        located = []
        for line, field, text in problems:
            for message in text.split("; ") if not field else [text]:
                at = _locate(message, data, lines) if not field else None
                located.append((*(at or (line, field)), message))
        raise TopologyFileError(path, located) from None


def _locate(
    message: str, data: dict[str, Any], lines: dict[tuple[str | int, ...], int]
) -> tuple[int | None, str] | None:
    for section, key in (("nodes", "name"), ("sites", "name")):
        items = data.get(section)
        if not isinstance(items, list):
            continue
        hits = [
            i
            for i, item in enumerate(items)
            if isinstance(item, dict) and f"{section[:-1]} {item.get(key)!r}" in message
        ]
        if hits:
            i = hits[-1]  # for a duplicate, the second declaration is the mistake
            field = "site" if section == "nodes" and "unknown site" in message else key
            return lines.get(
                (section, i, field), lines.get((section, i))
            ), f"{section}[{i}].{field}"
    links = data.get("links")
    if "link" in message and isinstance(links, list):
        for i, item in enumerate(links):
            between: object = item.get("between") if isinstance(item, dict) else None
            if isinstance(between, list) and "-".join(map(str, between)) in message:
                return lines.get(("links", i, "between")), f"links[{i}].between"
    return None


def load_topology(path: str | Path) -> Topology:
    """Read a topology YAML (or JSON) file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TopologyFileError(str(p), [(None, "", f"cannot read: {exc.strerror}")]) from None
    if p.suffix == ".json":
        try:
            return Topology.model_validate(json.loads(text))
        except (ValueError, ValidationError) as exc:
            raise TopologyFileError(str(p), [(None, "", str(exc))]) from None
    return load_topology_text(text, str(p))
