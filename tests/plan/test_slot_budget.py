"""The slot budget counts Python stateful steps: a fragment takes one slot for its Spark
query and one more per step that keeps state in Python workers, never more than a node
has. Planner, solver, shedding policy and the steps' own trait, without Spark."""

from __future__ import annotations

from typing import Any

import pytest

import spanflow as sf
from spanflow.api.topology_loader import load_topology_text
from spanflow.control.state import ClusterState, Observed
from spanflow.control.views import cluster_metrics, reach
from spanflow.plan.explain import explain_dict, explain_text
from spanflow.plan.fragments import compile_fragments
from spanflow.plan.placement import PlacementError, slot_need
from spanflow.plan.planner import offline_view, plan_pipeline
from spanflow.plan.solver import GroupDemand, NodeOffer, solve_exact, solve_greedy
from spanflow.runtime.load import FragmentLoad
from spanflow.runtime.shedding.policy import PeerLoad, Running, Shedder, SheddingConfig
from spanflow.spec.cluster import Assignment, Fragment, NodeRecord, NodeState
from spanflow.spec.topology import Capabilities
from tests.plan.test_fragments import readings
from tests.spark.processors import RunningMean

MEAN_OUT = {"device": "string", "n": "long", "mean": "double"}


def keep_last(acc: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    return record


def slots_of(flow: sf.Flow) -> int:
    return flow.spec().fragment_slots()


def test_each_python_stateful_step_counts_one_more_slot():
    p = sf.Pipeline("s")
    base = readings(p)
    assert slots_of(base.filter("temperature > 1").sink_console(id="o")) == 1
    sql_window = base.window(tumbling="10s").aggregate(n="count").sink_console(id="o")
    assert slots_of(sql_window) == 1, "a SQL window stays in the JVM"
    processed = base.process(RunningMean, output_schema=MEAN_OUT, id="mean")
    assert slots_of(processed.sink_console(id="o")) == 2
    detected = processed.detect_anomalies("mean", id="odd")
    assert slots_of(detected.sink_console(id="o")) == 3


def test_window_and_enrich_count_only_when_their_state_is_in_python():
    p = sf.Pipeline("w")
    base = readings(p)
    folded = base.window(tumbling="10s").reduce(keep_last, id="folded").sink_console(id="o")
    assert slots_of(folded) == 2
    session = base.window(session="30s").reduce(keep_last, id="sess").sink_console(id="o")
    assert slots_of(session) == 1, "a session window reduces collected records statelessly"
    live = base.enrich("kv:DEVICES", on="device", schema={"site": "string"}, id="e")
    assert slots_of(live.sink_console(id="o")) == 2


def test_a_node_never_charges_more_slots_than_it_has():
    assert Capabilities(cores=4).slots_for(3) == 3
    assert Capabilities(cores=1).slots_for(3) == 1, "an idle one-core node takes it, and is full"
    assert Capabilities(cores=2, slots=0).slots_for(2) == 1, "no slots: it takes nothing"


ONE_SITE = """
name: one
sites: [{name: a}]
nodes:
  - {name: n1, site: a, capabilities: {cores: 2}, streams: [{name: SENSORS, subjects: [s.>]}]}
  - {name: n2, site: a, capabilities: {cores: 2}}
"""


def keyed_flow(name: str) -> sf.Flow:
    p = sf.Pipeline(name)
    return (
        readings(p)
        .process(RunningMean, output_schema=MEAN_OUT, id="mean")
        .sink_jetstream("OUT", subject=f"out.{name}", id="o")
    )


def sql_flow(name: str) -> sf.Flow:
    p = sf.Pipeline(name)
    return readings(p).filter("temperature > 1").sink_jetstream("OUT", subject=f"o.{name}", id="o")


def test_a_keyed_fragment_fills_a_two_slot_node_and_the_next_goes_to_its_peer():
    topo = load_topology_text(ONE_SITE)
    view = offline_view(topo)
    compiled = compile_fragments(keyed_flow("k1").spec(), topo)
    first = plan_pipeline(compiled, view)
    (fragment,) = first.decisions
    assert slot_need(fragment.fragment) == 2 and fragment.slots == 2
    assert fragment.node == "n1" and view.used_slots["n1"] == 2
    assert "slots: 2 (one, plus one per step with Python state: mean)" in "\n".join(
        explain_text(compiled, first)
    )
    assert explain_dict(compiled, first)["fragments"][0]["slots"] == 2
    second = plan_pipeline(compile_fragments(keyed_flow("k2").spec(), topo), view)
    assert list(second.placement.values()) == ["n2"]
    assert view.used_slots == {"n1": 2, "n2": 2}
    with pytest.raises(PlacementError, match=r"n1 2/2, 2 needed"):
        plan_pipeline(compile_fragments(keyed_flow("k3").spec(), topo), view)


def test_a_node_with_one_slot_free_takes_a_sql_fragment_but_not_a_keyed_one():
    topo = load_topology_text(ONE_SITE)
    view = offline_view(topo)
    for name in ("q1", "q2", "q3"):  # n1 full, n2 half full
        plan_pipeline(compile_fragments(sql_flow(name).spec(), topo), view)
    assert sorted(view.used_slots.values()) == [1, 2]
    with pytest.raises(PlacementError, match="full"):
        plan_pipeline(compile_fragments(keyed_flow("k").spec(), topo), view)
    assert plan_pipeline(compile_fragments(sql_flow("q4").spec(), topo), view).placement


def test_releasing_a_keyed_fragment_gives_back_both_slots():
    topo = load_topology_text(ONE_SITE)
    view = offline_view(topo)
    plan = plan_pipeline(compile_fragments(keyed_flow("k").spec(), topo), view)
    (decision,) = plan.decisions
    view.release(decision.fragment, decision.node)
    assert view.used_slots[decision.node] == 0


LINKS = {frozenset({"a", "cloud"}): 0.03}


def latency(x: str, y: str) -> float | None:
    return 0.0 if x == y else LINKS.get(frozenset({x, y}))


@pytest.mark.parametrize("solve", [solve_exact, solve_greedy])
def test_the_solver_counts_a_groups_slots_capped_by_the_nodes_size(solve):
    near = NodeOffer("edge", "a", free_slots=1, slots=2)
    far = NodeOffer("cloud", "cloud", free_slots=4, slots=4)
    heavy = GroupDemand("heavy", ("a",), slots=2)
    assert solve([heavy], [near, far], latency).placement == {"heavy": "cloud"}
    small = NodeOffer("tiny", "a", free_slots=1, slots=1)  # idle, one slot in all
    assert solve([heavy], [small, far], latency).placement == {"heavy": "tiny"}
    two = [GroupDemand("h1", ("a",), slots=2), GroupDemand("h2", ("a",), slots=2)]
    with pytest.raises(PlacementError):
        solve(two, [NodeOffer("edge", "a", free_slots=3, slots=3)], latency)


CONFIG = SheddingConfig(high=0.9, low=0.6, sustain=10.0, cooldown=30.0)


def test_shedding_skips_a_peer_without_the_slots_a_keyed_fragment_takes():
    def load(name: str, batch_ms: int) -> FragmentLoad:
        return FragmentLoad(name, batch_ms, 1000, 100.0, 100.0, 0)

    keyed = [
        Running("k.f0", 0, None, load("k.f0", 200), slots=2),
        Running("busy.f0", 5, None, load("busy.f0", 800)),
    ]
    peers = [PeerLoad("one-free", 0.0, 1, 1.0), PeerLoad("two-free", 0.2, 2, 1.0)]
    shedder = Shedder(CONFIG)
    shedder.observe(0.0, 1.2, keyed, peers)
    request = shedder.observe(10.0, 1.2, keyed, peers)
    assert request is not None and (request.fragment, request.to) == ("k.f0", "two-free")
    shedder = Shedder(CONFIG)
    shedder.observe(0.0, 1.2, keyed, peers[:1])
    assert shedder.observe(10.0, 1.2, keyed, peers[:1]) is None


def test_cluster_metrics_count_the_slots_fragments_take():
    state = ClusterState()
    for node in load_topology_text(ONE_SITE).nodes:
        state.nodes[node.name] = NodeRecord(spec=node, state=NodeState.ALIVE)
    for fid, flow, node in (("k.f0", keyed_flow("k"), "n1"), ("q.f0", sql_flow("q"), "n2")):
        fragment = Fragment(id=fid, pipeline=fid[0], spec=flow.spec())
        state.assignments[fid] = Assignment(
            fragment=fragment, node=node, epoch=1, checkpoint_dir="/c"
        )
    observed = Observed()
    metrics = cluster_metrics(state, observed, 0.0, reach(state, observed, 0.0, 1.0))
    assert (metrics.slots, metrics.slots_used, metrics.utilisation) == (4, 3, 0.75)
