"""Settings that act: a step's cores and memory pins, the declared stream rates against
a link's bandwidth, and `nodes[].sinks` refused with its line."""

from __future__ import annotations

import pytest

import spanflow as sf
from spanflow.api import load_pipeline_text
from spanflow.api.topology_loader import load_topology_text
from spanflow.errors import SpecError, TopologyFileError
from spanflow.plan.explain import explain_text
from spanflow.plan.fragments import compile_fragments
from spanflow.plan.placement import PlacementError
from spanflow.plan.planner import offline_view, plan_pipeline
from spanflow.spec.cluster import NodeState

SCHEMA = {"device": "string", "ts": "timestamp", "v": "double"}

# An edge site with a small and a big node, a cloud with a small and a big node.
SIZES = """
sites: [{name: a}, {name: cloud, kind: cloud}]
nodes:
  - {name: small-a, site: a, capabilities: {cores: 2, memory_mb: 2g},
     streams: [{name: S, subjects: [s.a.>]}]}
  - {name: big-a, site: a, capabilities: {cores: 8, memory_mb: 16g}}
  - {name: small-c, site: cloud, capabilities: {cores: 2, memory_mb: 2g}}
  - {name: big-c, site: cloud, capabilities: {cores: 16, memory_mb: 64g}}
links: [{between: [a, cloud], latency: 30ms}]
"""


def _plan(flow: sf.Flow | sf.Stream, topology: str):  # type: ignore[no-untyped-def]
    topo = load_topology_text(topology)
    compiled = compile_fragments(flow.spec(), topo)
    return compiled, plan_pipeline(compiled, offline_view(topo))


def _pinned(*, cloud: bool = False, **on: object) -> sf.Flow:
    """Source → one map pinned with ``on`` → sink (the source in the cloud if asked)."""
    readings = sf.Pipeline("p", trigger="1s").source("S", schema=SCHEMA, id="in")
    if cloud:
        readings = readings.in_cloud()
    pinned = readings.map(y="v * 2", id="pinned").on(**on)  # type: ignore[arg-type]
    return pinned.sink_jetstream("OUT", subject="out", id="out")


def test_a_step_that_needs_8_gb_never_lands_on_a_2_gb_node_and_the_explanation_says_so():
    flow = _pinned(memory="8g")
    compiled, plan = _plan(flow, SIZES)
    (fragment,) = compiled.fragments
    assert fragment.node_memory_mb == 8192
    # small-a hosts the stream, but only big-a has the memory
    assert plan.placement == {"p.f0": "big-a"}
    assert "8 GiB of memory" in plan.decisions[0].why
    assert "least-loaded capable node there" in plan.decisions[0].why


def test_a_global_step_pinned_to_cores_goes_to_a_node_with_them():
    flow = _pinned(cores=12, cloud=True)
    _, plan = _plan(flow, SIZES)
    assert plan.placement == {"p.f0": "big-c"}
    assert "12 cores" in plan.decisions[0].why


def test_memory_no_node_of_the_site_has_falls_back_and_names_what_each_node_offers():
    flow = _pinned(memory="32g")
    _, plan = _plan(flow, SIZES)
    assert plan.placement == {"p.f0": "big-c"}
    why = plan.decisions[0].why
    assert why.startswith("fallback: no node at site a has 32 GiB of memory")
    assert "small-a 2 cores, 2 GiB" in why and "big-a 8 cores, 16 GiB" in why
    with pytest.raises(PlacementError, match="no other linked site can take it"):
        _plan(flow, SIZES.replace("memory_mb: 64g", "memory_mb: 16g"))


def test_a_global_fragment_with_memory_no_node_offers_is_refused():
    flow = _pinned(memory="128g", cloud=True)
    with pytest.raises(PlacementError, match=r"has 131072 MiB"):
        _plan(flow, SIZES)


def test_pins_in_yaml_take_sizes_and_bad_ones_name_the_field():
    text = """
name: p
sources: [{id: in, stream: S, schema: {v: double}, to: [m]}]
processors: [{id: m, type: map, columns: {y: v}, node_memory_mb: 8g, node_cores: 4, to: [out]}]
sinks: [{id: out, type: console}]
"""
    spec = load_pipeline_text(text, "p.yaml")
    assert spec.step("m").node_memory_mb == 8192
    assert spec.step("m").node_cores == 4
    with pytest.raises(SpecError, match=r"node_memory_mb"):
        load_pipeline_text(text.replace("node_memory_mb: 8g", "node_memory_mb: lots"), "p.yaml")
    with pytest.raises(SpecError, match=r"on\(\)"):
        sf.Pipeline("p").source("S", schema=SCHEMA).on(cores=0)


def _overall_window(**on: object) -> sf.Flow:
    """A 10 s count over every site's readings: split into partials and a merge."""
    p = sf.Pipeline("p", trigger="1s")
    overall = (
        p.source("S", schema=SCHEMA, key="device", event_time="ts", id="in")
        .map(scope="'all'", id="tag")
        .key_by("scope", id="by_scope")
        .window(tumbling="10s")
        .aggregate(n="count", id="overall")
    )
    if on:
        overall = overall.on(**on)  # type: ignore[arg-type]
    return overall.sink_jetstream("OUT", subject="out", id="out")


def test_a_split_window_pins_its_merge_not_the_partial():
    flow = _overall_window(memory="8g")
    two_sites = """
sites: [{name: a}, {name: b}, {name: cloud, kind: cloud}]
nodes:
  - {name: small-a, site: a, capabilities: {cores: 2, memory_mb: 2g},
     streams: [{name: S, subjects: [s.a.>]}]}
  - {name: big-a, site: a, capabilities: {cores: 8, memory_mb: 16g}}
  - {name: b1, site: b, capabilities: {cores: 2, memory_mb: 2g},
     streams: [{name: S, subjects: [s.b.>]}]}
  - {name: big-c, site: cloud, capabilities: {cores: 16, memory_mb: 64g}}
links:
  - {between: [a, cloud], latency: 30ms}
  - {between: [b, cloud], latency: 40ms}
  - {between: [a, b], latency: 5ms}
"""
    compiled, plan = _plan(flow, two_sites)
    memory = {f.id: f.node_memory_mb for f in compiled.fragments}
    assert memory == {"p.at-a": 0, "p.at-b": 0, "p.global": 8192}
    assert plan.placement["p.at-b"] == "b1"  # a small node still runs the partial
    assert plan.placement["p.global"] in ("big-a", "big-c")


# -- link bandwidth -----------------------------------------------------------------------
# 2,000 readings/s of 400 bytes (+100 bytes of message) = 8 Mbit/s at each edge.
RATES = """
sites: [{name: a}, {name: b}, {name: cloud, kind: cloud}]
nodes:
  - {name: ea, site: a, capabilities: {cores: 2},
     streams: [{name: S, subjects: [s.a.>], rate: 2000, record_bytes: 400}]}
  - {name: eb, site: b, capabilities: {cores: 2},
     streams: [{name: S, subjects: [s.b.>], rate: 2000, record_bytes: 400}]}
  - {name: c1, site: cloud, capabilities: {cores: 8}}
links:
  - {between: [a, cloud], latency: 20ms, bandwidth_mbps: BW_A}
  - {between: [b, cloud], latency: 30ms, bandwidth_mbps: 100}
  - {between: [a, b], latency: 60ms, bandwidth_mbps: 100}
"""


def _raw_union_in_cloud() -> sf.Flow:
    """Every reading crosses: a global step over raw records (a de-duplication by a key
    that spans sites)."""
    p = sf.Pipeline("p", trigger="1s")
    return (
        p.source("S", schema=SCHEMA, key="device", event_time="ts", id="in")
        .map(line="'l1'", id="tag")
        .deduplicate("line", within="10s", id="dedup")
        .sink_jetstream("OUT", subject="out", id="out")
    )


def test_what_a_cut_ships_is_estimated_from_the_declared_rates():
    compiled, plan = _plan(_raw_union_in_cloud(), RATES.replace("BW_A", "100"))
    glob = next(f for f in compiled.fragments if f.kind == "global")
    assert glob.traffic["a"].mbps == pytest.approx(8.0)
    assert not glob.traffic["a"].at_most
    assert plan.placement["p.global"] == "c1"
    # a batch of 1 s at 8 Mbit/s over 100 Mbit/s adds 80 ms to the 30 ms from b
    assert plan.decisions[-1].worst_latency == pytest.approx(0.03 + 0.08)
    assert "ships 8.0 Mbit/s from a over a 100 Mbit/s link" in plan.decisions[-1].why
    assert "(30 ms away, 80 ms to ship a batch)" in plan.decisions[-1].why


def test_a_link_too_thin_for_the_cut_moves_the_global_fragment_elsewhere():
    # a-cloud carries 5 Mbit/s, the cut from a needs 8: the cloud is out, an edge is in
    _, plan = _plan(_raw_union_in_cloud(), RATES.replace("BW_A", "5"))
    assert plan.placement["p.global"] == "ea"


def test_a_cut_no_link_can_carry_is_refused_with_the_figures():
    topo = RATES.replace("BW_A", "5").replace("bandwidth_mbps: 100}\n", "bandwidth_mbps: 6}\n")
    with pytest.raises(PlacementError) as info:
        _plan(_raw_union_in_cloud(), topo)
    message = str(info.value)
    assert "carries 5 Mbit/s" in message or "carries 6 Mbit/s" in message
    assert "at the declared stream rates" in message


def test_a_filter_before_the_cut_makes_the_estimate_an_upper_bound_that_is_explained():
    p = sf.Pipeline("p", trigger="1s")
    flow = (
        p.source("S", schema=SCHEMA, key="device", event_time="ts", id="in")
        .filter("v > 100", id="rare")
        .map(line="'l1'", id="tag")
        .deduplicate("line", within="10s", id="dedup")
        .sink_jetstream("OUT", subject="out", id="out")
    )
    topo = RATES.replace("BW_A", "5").replace("bandwidth_mbps: 100}\n", "bandwidth_mbps: 6}\n")
    compiled, plan = _plan(flow, topo)  # placed: the filter may keep far less
    glob = next(f for f in compiled.fragments if f.kind == "global")
    assert glob.traffic["a"].at_most
    text = "\n".join(explain_text(compiled, plan))
    assert "ships up to 8.0 Mbit/s from" in text
    assert "more than it carries (a filter on the way decides how much)" in text


def test_split_windows_ship_an_unknown_amount_and_are_not_held_to_the_rates():
    flow = _overall_window()
    compiled, plan = _plan(flow, RATES.replace("BW_A", "1"))
    glob = next(f for f in compiled.fragments if f.kind == "global")
    assert glob.traffic == {}
    assert plan.placement["p.global"] == "c1"


def test_a_fallback_over_a_link_that_cannot_carry_the_sites_data_is_refused():
    thin = RATES.replace("BW_A", "5").replace(
        "60ms, bandwidth_mbps: 100", "60ms, bandwidth_mbps: 2"
    )
    topo = load_topology_text(thin)
    p = sf.Pipeline("p", trigger="1s")
    flow = (
        p.source("S", schema=SCHEMA, key="device", event_time="ts", id="in")
        .key_by("device", id="by_device")
        .window(tumbling="10s")
        .aggregate(n="count", id="per_device")
        .sink_jetstream("OUT", subject="out", id="out")
    )
    compiled = compile_fragments(flow.spec(), topo)
    view = offline_view(topo)
    view.nodes["ea"] = view.nodes["ea"].model_copy(update={"state": NodeState.FAILED})
    with pytest.raises(PlacementError) as info:
        plan_pipeline(compiled, view)
    message = str(info.value)
    assert "no live node at site a" in message
    assert "ships 8.0 Mbit/s from a over a 5 Mbit/s link — more than it carries" in message
    # with a link that carries it, the fragment falls back to the cloud and says what crosses
    wide = load_topology_text(RATES.replace("BW_A", "1000"))
    view = offline_view(wide)
    view.nodes["ea"] = view.nodes["ea"].model_copy(update={"state": NodeState.FAILED})
    plan = plan_pipeline(compile_fragments(flow.spec(), wide), view)
    local = next(d for d in plan.decisions if d.fragment.id == "p.at-a")
    assert local.node == "c1"
    assert (
        "fallback" in local.why and "ships 8.0 Mbit/s from a over a 1000 Mbit/s link" in local.why
    )


def test_the_rate_of_a_stream_without_record_bytes_is_estimated_from_its_schema():
    topo = load_topology_text(
        "sites: [{name: a}]\nnodes: [{name: n, site: a, streams: [{name: S, rate: 1000,"
        " schema: {device: string, ts: timestamp, v: double}}]}]\n"
    )
    hosted = topo.node("n").streams[0]  # type: ignore[union-attr]
    # {"device": 16 bytes, "ts": 26, "v": 12} as JSON ≈ 77 bytes, + 100 of message
    assert hosted.bytes_per_second() == pytest.approx(1000 * 177)


# -- nodes[].sinks -------------------------------------------------------------------------
def test_node_sinks_are_refused_with_their_line_and_what_to_use_instead():
    with pytest.raises(TopologyFileError) as info:
        load_topology_text(
            "sites: [{name: a}]\nnodes:\n  - name: n\n    site: a\n    sinks: [ALERTS]\n",
            "t.yaml",
        )
    message = str(info.value)
    assert "t.yaml:3: nodes[0]" in message
    assert "externals" in message


def test_an_empty_sinks_list_as_older_records_store_it_is_accepted():
    topo = load_topology_text("sites: [{name: a}]\nnodes: [{name: n, site: a, sinks: []}]\n")
    assert topo.node("n") is not None
