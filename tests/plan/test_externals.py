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
