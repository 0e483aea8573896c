"""What a pipeline file may leave to the node registry (the topology).

A source without a schema of its own that reads a stream the topology declares
(``nodes[].streams``) inherits the stream's ``format``, ``schema``, ``key`` and
``event_time`` (those it does not give); a source or sink that names an external
system (``external: plant-kafka``) inherits its address (``bootstrap``, ``dsn``,
``endpoint``, ``uri`` or ``url``). This runs on the pipeline document before it is
validated, so the spec that results is complete on its own: what runs does not
depend on the topology it was loaded with.
"""

from __future__ import annotations

from typing import Any

from spanflow.spec.connectors import Role, lookup
from spanflow.spec.steps.io import DEFAULT_CONNECTOR
from spanflow.spec.topology import HostedStream, Topology

INHERITED = ("format", "schema", "key", "event_time")
Problems = list[tuple[int, str]]
"""(index of the step in the document, what is wrong)."""


def with_registry(document: dict[str, Any], topology: Topology) -> tuple[dict[str, Any], Problems]:
    """The document with what its sources and sinks leave out filled from the topology,
    and the conflicts found (a stream declared differently on two nodes)."""
    problems: Problems = []
    steps = []
    for index, step in enumerate(document.get("steps") or []):
        if isinstance(step, dict) and step.get("type") in ("source", "sink"):
            step = _from_external(step, topology)
            if step.get("type") == "source":
                step, problem = _from_stream(step, topology)
                if problem:
                    problems.append((index, problem))
        steps.append(step)
    return {**document, "steps": steps}, problems


def _from_stream(step: dict[str, Any], topology: Topology) -> tuple[dict[str, Any], str | None]:
    if step.get("connector", DEFAULT_CONNECTOR) != DEFAULT_CONNECTOR or not isinstance(
        step.get("stream"), str
    ):
        return step, None
    if step.get("schema"):
        return step, None  # its own schema: key and event time are its own to give too
    declared: list[HostedStream] = [
        h for node in topology.hosts_of(step["stream"]) for h in node.streams
        if h.name == step["stream"]
    ]  # fmt: skip
    if not declared:
        return step, None
    facts = [_facts(h) for h in declared]
    if any(f != facts[0] for f in facts[1:]):
        return step, (
            f"stream {step['stream']} is declared with different formats, schemas, keys or "
            "event times on different nodes: give them in the source"
        )
    filled = dict(step)
    for name, value in facts[0].items():
        if value and not filled.get(name):
            filled[name] = value
    return filled, None


def _facts(hosted: HostedStream) -> dict[str, Any]:
    return {
        "format": hosted.format.value,
        "schema": dict(hosted.schema_),
        "key": hosted.key,
        "event_time": hosted.event_time,
    }


def _from_external(step: dict[str, Any], topology: Topology) -> dict[str, Any]:
    name = step.get("external")
    ext = topology.external(name) if isinstance(name, str) else None
    if ext is None or not ext.address:
        return step  # an unknown name is the planner's error to report, with the known ones
    role: Role = "source" if step.get("type") == "source" else "sink"
    connector_name = step.get("connector", step.get("kind", DEFAULT_CONNECTOR))
    try:
        connector = lookup(role, str(connector_name))
    except Exception:
        return step  # validation names the unknown connector
    options = step.get("options")
    option = connector.address_option
    if option is None or (isinstance(options, dict) and options.get(option)):
        return step
    return {**step, "options": {**(options if isinstance(options, dict) else {}),
                                option: ext.address}}  # fmt: skip
