"""External systems in the topology: a fragment that reads or writes one runs at a
site that reaches it, says so, and is refused when no node can reach it."""

from __future__ import annotations

import pytest

import spanflow as sf
from spanflow.api.topology_loader import load_topology_text
from spanflow.errors import SpecError
from spanflow.plan.explain import explain_text
from spanflow.plan.fragments import compile_fragments
from spanflow.plan.placement import PlacementError
from spanflow.plan.planner import offline_view, plan_pipeline

TOPOLOGY = """
name: plants
sites:
  - {name: factory-a, kind: edge}
  - {name: factory-b, kind: edge}
  - {name: factory-c, kind: edge}
  - {name: cloud, kind: cloud}
nodes:
  - {name: edge-a, site: factory-a, streams: [{name: SENSORS, subjects: ["s.a.>"]}]}
  - {name: edge-b, site: factory-b, streams: [{name: SENSORS, subjects: ["s.b.>"]}]}
  - {name: cloud-1, site: cloud}
links:
  - {between: [factory-a, cloud], latency: 30ms}
  - {between: [factory-b, cloud], latency: 40ms}
  - {between: [factory-a, factory-b], latency: 20ms}
externals:
  - {name: plant-kafka, type: kafka, sites: [factory-a], address: "10.0.0.5:9092,10.0.0.6:9092"}
  - {name: warehouse, type: postgres, sites: [cloud], address: "postgresql://db.cloud:5432/w"}
  - {name: lab-kafka, type: kafka, sites: [factory-c], address: "10.9.0.1:9092"}
"""
SCHEMA = {"device": "string", "t": "double"}


def _plan(flow: sf.Flow):
    topo = load_topology_text(TOPOLOGY)
    compiled = compile_fragments(flow.spec(), topo)
    return compiled, plan_pipeline(compiled, offline_view(topo))


def test_a_kafka_source_runs_at_the_site_that_reaches_its_brokers():
    flow = (
        sf.Pipeline("k")
        .source_kafka("readings", bootstrap="10.0.0.6:9092", schema=SCHEMA)
        .filter("t > 40")
        .sink_console()
    )
    compiled, plan = _plan(flow)
    assert plan.placement == {"k.f0": "edge-a"}
    text = "\n".join(explain_text(compiled, plan))
    assert "reads kafka plant-kafka, reachable from factory-a" in text
    assert "its external systems are reachable from factory-a" in text


def test_a_sink_moves_to_where_its_database_is_reachable():
    flow = (
        sf.Pipeline("w")
        .source("SENSORS", schema=SCHEMA)
        .filter("t > 40")
        .sink_postgres("alerts", dsn="postgresql://spanflow@DB.cloud/w")
    )
    compiled, plan = _plan(flow)
    assert plan.placement == {"w.at-factory-a": "edge-a", "w.at-factory-b": "edge-b",
                              "w.global": "cloud-1"}  # fmt: skip
    assert "writes postgres warehouse, reachable only from cloud" in compiled.reasons["sink_2"]


def test_an_unknown_or_unreachable_external_is_refused_at_planning():
    named = (
        sf.Pipeline("u")
        .source_kafka("r", bootstrap="10.0.0.5:9092", schema=SCHEMA)
        .sink_console()
        .spec()
    )
    step = named.sources()[0].model_copy(update={"external": "nope"})
    spec = named.model_copy(update={"steps": (step, *named.steps[1:])})
    with pytest.raises(SpecError, match="uses external 'nope', which the topology does not"):
        compile_fragments(spec, load_topology_text(TOPOLOGY))
    lab = sf.Pipeline("lab").source_kafka("r", bootstrap="10.9.0.1:9092", schema=SCHEMA)
    with pytest.raises(PlacementError, match=r"no live node .* \['factory-c'\]"):
        _plan(lab.sink_console())
    cloud = sf.Pipeline("c").source_kafka("r", bootstrap="10.0.0.5:9092", schema=SCHEMA)
    with pytest.raises(PlacementError, match="pinned to the cloud, but its external systems"):
        _plan(cloud.in_cloud().sink_console())


def test_steps_whose_externals_share_no_site_are_refused():
    flow = (
        sf.Pipeline("x")
        .source_kafka("r", bootstrap="10.0.0.5:9092", schema=SCHEMA)
        .sink_postgres("t", dsn="postgresql://u@db.cloud:5432/w")
    )
    with pytest.raises(SpecError, match="no site reaches every external these steps use"):
        _plan(flow)


REGISTRY = TOPOLOGY.replace(
    '{name: edge-a, site: factory-a, streams: [{name: SENSORS, subjects: ["s.a.>"]}]}',
    '{name: edge-a, site: factory-a, streams: [{name: SENSORS, subjects: ["s.a.>"], '
    "schema: {device: string, t: double, ts: timestamp}, key: device, event_time: ts}]}",
).replace(
    '{name: edge-b, site: factory-b, streams: [{name: SENSORS, subjects: ["s.b.>"]}]}',
    '{name: edge-b, site: factory-b, streams: [{name: SENSORS, subjects: ["s.b.>"], '
    "schema: {device: string, t: double, ts: timestamp}, key: device, event_time: ts}]}",
)


def test_sources_and_sinks_inherit_what_they_leave_out_from_the_registry():
    from spanflow.api import load_pipeline_text

    text = """
name: inherit
sources:
  - {id: readings, stream: SENSORS, to: [hot]}
  - {id: plant, type: kafka, external: plant-kafka, topic: r, schema: {device: string}, to: [p]}
processors:
  - {id: hot, type: filter, where: "t > 40", to: [h]}
  - {id: h, type: select, columns: [device], to: [out]}
  - {id: p, type: select, columns: [device], to: [console]}
sinks:
  - {id: out, type: postgres, external: warehouse, table: alerts}
  - {id: console, type: console}
"""
    topo = load_topology_text(REGISTRY)
    spec = load_pipeline_text(text, "p.yaml", topology=topo)
    readings, plant = spec.sources()
    assert (readings.schema_, readings.key, readings.event_time) == (
        {"device": "string", "t": "double", "ts": "timestamp"}, "device", "ts",
    )  # fmt: skip
    assert plant.options.bootstrap == "10.0.0.5:9092,10.0.0.6:9092"  # type: ignore[attr-defined]
    assert spec.sinks()[0].options.dsn == "postgresql://db.cloud:5432/w"  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match=r"p.yaml:4: sources\[0\]: format json needs a schema"):
        load_pipeline_text(text, "p.yaml")  # without the registry, nothing to inherit
    clash = REGISTRY.replace("key: device, event_time: ts}]}", "key: device}]}", 1)
    with pytest.raises(SpecError, match="SENSORS is declared with different formats"):
        load_pipeline_text(text, "p.yaml", topology=load_topology_text(clash))
