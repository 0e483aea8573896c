"""Placement of compiled pipelines: locality, MinMax, pins, capabilities, budgets, fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

import spanflow as sf
from spanflow.api import load_pipeline
from spanflow.api.topology_loader import load_topology, load_topology_text
from spanflow.errors import SpecError
from spanflow.plan.explain import explain_dict, explain_text
from spanflow.plan.fragments import compile_fragments
from spanflow.plan.placement import PlacementError
from spanflow.plan.planner import offline_view, plan_pipeline
from spanflow.spec.cluster import NodeState

ROOT = Path(__file__).resolve().parents[2]
GEO = ROOT / "examples" / "cluster"

# Two edge sites close to each other, a cloud farther away, and a GPU node at the edge.
NEAR_EDGES = """
name: near
sites: [{name: a}, {name: b}, {name: cloud, kind: cloud}]
nodes:
  - {name: ea, site: a, capabilities: {cores: 2}, streams: [{name: S, subjects: [s.a.>]}]}
  - {name: eb, site: b, capabilities: {cores: 2, tags: [gpu]},
     streams: [{name: S, subjects: [s.b.>]}]}
  - {name: c1, site: cloud, capabilities: {cores: 4}}
links:
  - {between: [a, b], latency: 10ms}
  - {between: [a, cloud], latency: 40ms}
  - {between: [b, cloud], latency: 45ms}
"""


def overall(name: str = "p") -> sf.Stream:
    p = sf.Pipeline(name, trigger="0.5s")
    return (
        p.source(
            "S",
            schema={"device": "string", "ts": "timestamp", "v": "double"},
            key="device",
            event_time="ts",
            id="in",
        )
        .map(scope="'all'", id="tag")
        .key_by("scope", id="by_scope")
        .window(tumbling="10s")
        .aggregate(n="count", mean="avg(v)", id="overall")
    )


def test_the_geo_example_runs_edges_at_home_and_the_merge_in_the_cloud():
    compiled = compile_fragments(
        load_pipeline(GEO / "factory_monitoring.yaml"), load_topology(GEO / "topology.yaml")
    )
    plan = plan_pipeline(compiled, offline_view(load_topology(GEO / "topology.yaml")))
    assert plan.placement == {
        "factory-monitoring.at-factory-a": "edge-a",
        "factory-monitoring.at-factory-b": "edge-b",
        "factory-monitoring.global": "cloud-1",
    }
    # MinMax: the cloud is 50 ms from its farthest input; each edge is 60 ms from the other.
    glob = plan.decisions[-1]
    assert glob.worst_latency == pytest.approx(0.05)
    assert glob.alternatives == [("edge-a", pytest.approx(0.06)), ("edge-b", pytest.approx(0.06))]
    assert plan.exact_cost == pytest.approx(plan.greedy_cost)
    text = "\n".join(explain_text(compiled, plan))
    assert "MinMax: 50 ms from its farthest input site (factory-b)" in text
    assert "per_device_10s         local   keyed by device, which is born at one site" in text
    assert explain_dict(compiled, plan)["latency"]["network_s"] == pytest.approx(0.05)


def test_minmax_picks_an_edge_when_it_is_closer_unless_pinned_to_the_cloud():
    topo = load_topology_text(NEAR_EDGES)
    flow = overall().sink_jetstream("OUT", subject="out", id="out")
    plan = plan_pipeline(compile_fragments(flow.spec(), topo), offline_view(topo))
    assert plan.placement["p.global"] in ("ea", "eb")  # 10 ms beats the cloud's 45 ms
    assert plan.decisions[-1].worst_latency == pytest.approx(0.01)

    pinned = overall().in_cloud().sink_jetstream("OUT", subject="out", id="out")
    plan = plan_pipeline(compile_fragments(pinned.spec(), topo), offline_view(topo))
    assert plan.placement["p.global"] == "c1"
    assert "pinned to the cloud" in plan.decisions[-1].why


def test_tags_pin_a_global_fragment_and_a_missing_tag_is_named():
    topo = load_topology_text(NEAR_EDGES)
    gpu = overall().on(tags=["gpu"]).sink_jetstream("OUT", subject="out", id="out")
    plan = plan_pipeline(compile_fragments(gpu.spec(), topo), offline_view(topo))
    assert plan.placement["p.global"] == "eb"
    tpu = overall().on(tags=["tpu"]).sink_jetstream("OUT", subject="out", id="out")
    with pytest.raises(PlacementError, match=r"fragment p.global: no node has tags \['tpu'\]$"):
        plan_pipeline(compile_fragments(tpu.spec(), topo), offline_view(topo))


ACCELERATED = """
name: accelerated
sites: [{name: a}, {name: cloud, kind: cloud}]
nodes:
  - {name: a-cpu, site: a, capabilities: {cores: 4}, streams: [{name: S, subjects: [s.a.>]}]}
  - {name: a-gpu, site: a, capabilities: {cores: 2, accelerators: [gpu]}}
  - {name: c-cpu, site: cloud, capabilities: {cores: 8}}
  - {name: c-gpu, site: cloud, capabilities: {cores: 8, accelerators: [gpu]}}
links: [{between: [a, cloud], latency: 40ms}]
"""


def test_accelerator_pins_choose_a_node_that_has_one_locally_and_globally():
    topo = load_topology_text(ACCELERATED)
    source = sf.Pipeline("p").source(
        "S", schema={"device": "string", "v": "double"}, key="device", id="in"
    )
    local = source.map(w="v * 2", id="m").on(accelerators="gpu").sink_console(id="out")
    plan = plan_pipeline(compile_fragments(local.spec(), topo), offline_view(topo))
    assert plan.placement == {"p.f0": "a-gpu"}
    assert "accelerators ['gpu']" in plan.decisions[0].why

    cloud = source.in_cloud().on(accelerators=["gpu"]).sink_console(id="out")
    plan = plan_pipeline(compile_fragments(cloud.spec(), topo), offline_view(topo))
    assert list(plan.placement.values()) == ["c-gpu"]

    tpu = source.map(w="v", id="m").on(accelerators="tpu").sink_console(id="out")
    with pytest.raises(PlacementError, match=r"no node at site a has accelerators \['tpu'\]"):
        plan_pipeline(compile_fragments(tpu.spec(), topo), offline_view(topo))
    with pytest.raises(SpecError, match="at least one tag, accelerator, cores or memory"):
        source.on()


def test_latency_budget_errors_say_which_part_is_short_and_by_how_much():
    topo = load_topology_text(NEAR_EDGES)
    pinned = overall().in_cloud().sink_jetstream("OUT", subject="out", id="out")
    compiled = compile_fragments(pinned.spec(), topo)
    # two fragments on the path: 2 x (0.5 s trigger + 0.2 s) = 1.4 s of processing
    with pytest.raises(PlacementError, match="budget 1000 ms is 400 ms short before any network"):
        plan_pipeline(compiled, offline_view(topo), latency_budget=1.0)
    with pytest.raises(PlacementError) as err:
        plan_pipeline(compiled, offline_view(topo), latency_budget=1.42)
    assert "latency budget 20 ms is 25 ms short" in str(err.value)
    assert "leaves 20 ms for the network" in str(err.value)
    plan = plan_pipeline(compiled, offline_view(topo), latency_budget=1.5)
    assert plan.latency_estimate == pytest.approx(1.445)


def test_a_local_fragment_falls_back_to_the_nearest_site_when_its_own_has_no_node():
    topo = load_topology_text(NEAR_EDGES)
    flow = overall().sink_jetstream("OUT", subject="out", id="out")
    compiled = compile_fragments(flow.spec(), topo)
    view = offline_view(topo)
    view.nodes["ea"] = view.nodes["ea"].model_copy(update={"state": NodeState.FAILED})
    plan = plan_pipeline(compiled, view)
    assert plan.placement["p.at-a"] == "eb"  # b is 10 ms from a; the cloud 40 ms
    assert plan.decisions[0].why.startswith("fallback: no live node at site a")


def test_a_declared_host_is_waited_for_rather_than_replaced():
    topo = load_topology_text(NEAR_EDGES)
    flow = overall().sink_jetstream("OUT", subject="out", id="out")
    view = offline_view(topo)
    view.nodes["eb"] = view.nodes["eb"].model_copy(update={"state": NodeState.DECLARED})
    with pytest.raises(PlacementError, match=r"p.at-b: waiting for eb \(hosts its input\)"):
        plan_pipeline(compile_fragments(flow.spec(), topo), view)


def test_slots_taken_by_earlier_pipelines_push_later_ones_elsewhere():
    topo = load_topology_text(NEAR_EDGES)
    view = offline_view(topo)
    first = overall("p1").sink_jetstream("O1", subject="o1", id="out")
    second = overall("p2").sink_jetstream("O2", subject="o2", id="out")
    a = plan_pipeline(compile_fragments(first.spec(), topo), view)
    # ea and eb have two slots each; p1 takes one on each plus its merge on one of them
    assert a.placement["p1.global"] in ("ea", "eb")
    b = plan_pipeline(compile_fragments(second.spec(), topo), view)
    used = {n: view.used_slots.get(n, 0) for n in ("ea", "eb", "c1")}
    assert used == {"ea": 2, "eb": 2, "c1": 2}
    full_site = "a" if a.placement["p1.global"] == "ea" else "b"
    fallback = b.decisions[0 if full_site == "a" else 1]
    assert fallback.why.startswith(f"fallback: every capable node at site {full_site} is full")
    assert b.placement["p2.global"] == "c1"  # the only node left with room


# Site a has a node with two real-time task slots and one with none.
REALTIME_SITE = """
name: rt
sites: [{name: a}, {name: cloud, kind: cloud}]
nodes:
  - {name: small, site: a, capabilities: {cores: 2, realtime_slots: 0},
     streams: [{name: S, subjects: [s.a.>]}]}
  - {name: big, site: a, capabilities: {cores: 2, realtime_slots: 2}}
  - {name: c1, site: cloud, capabilities: {cores: 4, realtime_slots: 0}}
links:
  - {between: [a, cloud], latency: 40ms}
"""


def alerts(name: str, *, keyed: bool = False, mode: str = "realtime") -> sf.Flow:
    p = sf.Pipeline(name, mode=mode)
    stream = p.source("S", schema={"device": "string", "v": "double"}, id="in")
    if keyed:
        stream = stream.key_by("device").aggregate(n="count")
    else:
        stream = stream.filter("v > 1", id="hot")
    return stream.sink_jetstream("OUT", subject=f"out.{name}", id="out")


def test_real_time_task_slots_are_counted_per_node():
    topo = load_topology_text(REALTIME_SITE)
    view = offline_view(topo)
    # The node hosting the input has no real-time slots: the fragment goes to its peer.
    first = plan_pipeline(compile_fragments(alerts("p1", keyed=True).spec(), topo), view)
    assert first.placement["p1.f0"] == "big"
    assert view.used_realtime == {"big": 2}  # a keyed real-time query holds two
    # Now no node at the site has one free: the error says so.
    with pytest.raises(PlacementError) as err:
        plan_pipeline(compile_fragments(alerts("p2").spec(), topo), view)
    assert "real-time task slots 0 free of 1 needed" in str(err.value)
    # A micro-batch pipeline still fits.
    micro = overall("p3").sink_jetstream("O3", subject="o3", id="out")
    assert plan_pipeline(compile_fragments(micro.spec(), topo), view).placement


def test_real_time_pipelines_are_not_charged_a_batch_per_hop_in_budgets():
    topo = load_topology_text(REALTIME_SITE)
    compiled = compile_fragments(alerts("p").spec(), topo)
    plan = plan_pipeline(compiled, offline_view(topo), latency_budget=0.05)
    assert plan.processing == pytest.approx(0.005)
    micro = compile_fragments(alerts("p", mode="microbatch").spec(), topo)
    with pytest.raises(PlacementError, match="trigger 500 ms"):
        plan_pipeline(micro, offline_view(topo), latency_budget=0.05)
