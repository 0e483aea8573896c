"""The fleet room: a placed pipeline's plan against today's topology (pure, over an
in-memory log). A site declared after the pipeline was placed is named as joined, a
removed one as left, in the pipeline's status answer."""

from __future__ import annotations

import pytest

import spanflow as sf
from spanflow.api.topology_loader import load_topology_text
from spanflow.control import fleet, pipelines, registry, views
from spanflow.control.requests import Submission
from spanflow.control.state import Draft
from spanflow.spec.cluster import PipelineState
from tests.control.test_rooms import TOPOLOGY, Cluster

SCHEMA = {"x": "long", "ts": "timestamp"}

SITE_C = (
    TOPOLOGY.replace("  - {name: cloud,", "  - {name: edge-c}\n  - {name: cloud,")
    .replace(
        "  - {name: c1,",
        '  - {name: c3, site: edge-c, streams: [{name: IN_A, subjects: ["in.c.>"]}]}\n'
        "  - {name: c1,",
    )
    .replace("links:\n", "links:\n  - {between: [edge-c, cloud], latency: 30ms}\n")
)
"""The topology with a third site whose node hosts the pipeline's stream (its own
subjects)."""


def _spec():  # type: ignore[no-untyped-def]
    src = sf.Pipeline("p1").source("IN_A", schema=SCHEMA, event_time="ts", id="src")
    return (
        src.window(tumbling="10s")
        .aggregate(n="count", id="per_10s")
        .sink_jetstream("OUT_P1", subject="out.p1", id="out")
        .spec()
    )


def _placed(cluster: Cluster) -> Cluster:
    def submit(tx: Draft) -> None:
        pipelines.submit(tx, Submission(spec=_spec()), run_id="run-p1")
        cluster.schedule(tx)

    cluster.c.decide(submit)
    assert cluster.state.pipelines["p1"].fragments
    return cluster


@pytest.fixture
def running() -> Cluster:
    cluster = Cluster()
    cluster.register("a1", "edge-a")
    _placed(cluster)
    cluster.beat("a1", p1__f0="running")
    assert cluster.state.pipelines["p1"].state == PipelineState.RUNNING
    return cluster


def _status(cluster: Cluster):  # type: ignore[no-untyped-def]
    at = views.reach(cluster.state, cluster.c.observed, 0.0, 1.0)
    return views.pipeline_status(cluster.state, cluster.c.observed, "p1", at)


def test_a_placed_plan_that_covers_the_topology_is_not_behind(running) -> None:
    assert fleet.sites_behind(running.state, running.state.pipelines["p1"]) is None
    assert _status(running).sites_behind is None


def test_a_site_hosting_the_pipelines_stream_after_placement_is_named_as_joined(running) -> None:
    planned = [f.id for f in running.state.pipelines["p1"].fragments]
    running.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_C)))
    behind = _status(running).sites_behind
    assert behind is not None and (behind.joined, behind.left) == (["edge-c"], [])
    # nothing was re-planned behind the user's back
    assert [f.id for f in running.state.pipelines["p1"].fragments] == planned
    # a replayed log (a standby coordinator) sees the same
    replayed = running.c.replayed()
    again = fleet.sites_behind(replayed, replayed.pipelines["p1"])
    assert again is not None and again.joined == ["edge-c"]


def test_a_site_whose_node_is_removed_is_named_as_left() -> None:
    cluster = Cluster()
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_C)))
    cluster.register("a1", "edge-a")
    cluster.register("c3", "edge-c")
    cluster.register("c1", "cloud")
    _placed(cluster)
    assert fleet.sites_of(cluster.state.pipelines["p1"].fragments) >= {"edge-a", "edge-c"}
    cluster.c.decide(lambda tx: registry.remove(tx, "c3"))
    behind = fleet.sites_behind(cluster.state, cluster.state.pipelines["p1"])
    assert behind is not None and (behind.joined, behind.left) == ([], ["edge-c"])
    change = fleet.plan_change(cluster.state, cluster.state.pipelines["p1"])
    assert change is not None and "p1.at-edge-c" in change.removed


def test_an_ended_pipeline_is_never_behind(running) -> None:
    running.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_C)))
    assert fleet.sites_behind(running.state, running.state.pipelines["p1"]) is not None
    running.c.decide(lambda tx: pipelines.cancel(tx, "p1"))
    assert fleet.sites_behind(running.state, running.state.pipelines["p1"]) is None


SITE_D = (
    SITE_C.replace("  - {name: cloud,", "  - {name: edge-d}\n  - {name: cloud,")
    .replace(
        "  - {name: c1,",
        '  - {name: d4, site: edge-d, streams: [{name: IN_A, subjects: ["in.d.>"]}]}\n'
        "  - {name: c1,",
    )
    .replace("links:\n", "links:\n  - {between: [edge-d, cloud], latency: 30ms}\n")
)
"""SITE_C with a fourth site hosting the pipeline's stream."""


def test_taking_a_new_site_in_adds_its_local_part_changes_the_global_and_keeps_the_rest() -> None:
    cluster = Cluster()
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_C)))
    for node, site in (("a1", "edge-a"), ("c3", "edge-c"), ("c1", "cloud")):
        cluster.register(node, site)
    record = _placed(cluster).state.pipelines["p1"]
    running = sorted(f.id for f in record.fragments)
    assert running == ["p1.at-edge-a", "p1.at-edge-c", "p1.global"]
    assert fleet.plan_change(cluster.state, record) == fleet.PlanChange(kept=running)
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_D)))
    change = fleet.plan_change(cluster.state, cluster.state.pipelines["p1"])
    assert change is not None and not change.empty
    assert [(f.id, f.site) for f in change.added] == [("p1.at-edge-d", "edge-d")]
    assert [f.id for f in change.changed] == ["p1.global"]
    assert set(change.changed[0].input_sites) == {"edge-a", "edge-c", "edge-d"}
    assert sorted(change.kept) == ["p1.at-edge-a", "p1.at-edge-c"] and change.removed == []


def _three_running() -> Cluster:
    """p1 placed on edge-a and edge-c with its global part in the cloud, all running."""
    cluster = Cluster()
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_C)))
    for node, site in (("a1", "edge-a"), ("c3", "edge-c"), ("c1", "cloud")):
        cluster.register(node, site)
    _placed(cluster)
    by_node: dict[str, dict[str, str]] = {}
    for fid, a in cluster.state.assignments.items():  # beat() reads "__" as "."
        by_node.setdefault(a.node, {})[fid.replace(".", "__")] = "running"
    for node, fragments in by_node.items():
        cluster.beat(node, **fragments)
    assert cluster.state.pipelines["p1"].state == PipelineState.RUNNING
    return cluster


def _follow(cluster: Cluster) -> dict[str, str]:
    out: dict[str, dict[str, str]] = {}
    cluster.c.decide(lambda tx: out.update(done=pipelines.follow_sites(tx, "/tmp/sp")))
    return out["done"]


def test_a_site_joining_a_running_pipeline_upgrades_it_to_its_own_plan() -> None:
    cluster = _three_running()
    assert _follow(cluster) == {}  # the plan covers the topology
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_D)))
    assert _follow(cluster) == {"p1": "site edge-d joined: upgrading"}
    record = cluster.state.pipelines["p1"]
    assert record.upgrade == record.spec  # the same version, planned again
    (asked,) = [e for e in cluster.c.log if e.kind == "pipeline-upgrade"]
    assert asked.because == "site edge-d joined"
    added = {(s["sink"], s["verdict"]) for s in asked.steps if s["verdict"] == "added"}
    assert added and all(verdict == "added" for _, verdict in added)
    assert _follow(cluster) == {}  # asked once: the upgrade is pending


def test_a_pipeline_placed_before_sources_were_named_is_not_followed() -> None:
    cluster = _three_running()
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_D)))
    old = cluster.state.pipelines["p1"].model_copy(update={"named_sources": False})
    cluster.state.pipelines["p1"] = old
    assert "resubmit" in _follow(cluster)["p1"]
    assert cluster.state.pipelines["p1"].upgrade is None
