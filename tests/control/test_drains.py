"""A site that leaves a running pipeline is drained before the pipeline lets it go
(pure, over an in-memory control log): the global fragment reads all the site sent."""

from __future__ import annotations

from typing import Any

from spanflow.api.topology_loader import load_topology_text
from spanflow.control import drains, pipelines, registry, views
from spanflow.spec.cluster import PipelineState
from spanflow.spec.topology import NodeSpec
from tests.control.test_fleet import SITE_D, _placed, _three_running
from tests.control.test_rooms import Cluster

LOCAL, GLOBAL = "p1.at-edge-d", "p1.global"


def _four_running() -> Cluster:
    """p1 placed on edge-a, edge-d and edge-d with its global part in the cloud, all
    running (a site leaving still leaves two: the global fragment stays)."""
    cluster = Cluster()
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_D)))
    for node, site in (("a1", "edge-a"), ("c3", "edge-c"), ("d4", "edge-d"), ("c1", "cloud")):
        cluster.register(node, site)
    _placed(cluster)
    for fid, a in cluster.state.assignments.items():
        _report(cluster, a.node, fid)
    assert cluster.state.pipelines["p1"].state == PipelineState.RUNNING
    return cluster


def _follow(cluster: Cluster) -> str:
    def runtime_of(fid: str) -> Any:
        a = cluster.state.assignments.get(fid)
        return cluster.c.observed.current(a) if a is not None else None

    out: dict[str, dict[str, str]] = {}
    cluster.c.decide(lambda tx: out.update(done=pipelines.follow_sites(tx, "/tmp/sp", runtime_of)))
    return out["done"].get("p1", "")


def _report(cluster: Cluster, node: str, fid: str, **figures: float) -> None:
    cluster.beat(node, progress={fid: figures}, **{fid.replace(".", "__"): "running"})


def _stream_undeclared(cluster: Cluster) -> Cluster:
    """edge-d's node no longer hosts the pipeline's stream: the site left p1."""
    cluster.c.decide(lambda tx: registry.put_node(tx, NodeSpec(name="d4", site="edge-d")))
    return cluster


def _draining(cluster: Cluster) -> list[str]:
    at = views.reach(cluster.state, cluster.c.observed, 0.0, 1.0)
    behind = views.pipeline_status(cluster.state, cluster.c.observed, "p1", at).sites_behind
    assert behind is not None and behind.left == ["edge-d"]
    return behind.draining


def _kinds(cluster: Cluster) -> list[str]:
    return [e.kind for e in cluster.c.log]


def test_a_site_that_left_is_let_go_once_the_global_fragment_has_read_what_it_sent() -> None:
    cluster = _stream_undeclared(_four_running())
    _report(cluster, "d4", LOCAL, lag=5, rows_in=95)
    assert _follow(cluster) == (
        f"site edge-d left: draining (edge-d: {LOCAL} has 5 messages left to read)"
    )
    assert "site-draining" not in _kinds(cluster) and _draining(cluster) == []

    _report(cluster, "d4", LOCAL, lag=0, rows_in=100)
    _report(cluster, "c1", GLOBAL, lag=0, batches=10)
    assert _follow(cluster) == "site edge-d left: draining (marked)"
    mark = cluster.state.pipelines["p1"].draining["edge-d"]
    assert (mark.global_batches, mark.site_rows_in) == ({GLOBAL: 10}, 100)
    assert _draining(cluster) == ["edge-d"]

    for batches, lag in ((11, 0), (12, 3)):  # one batch may predate the mark; then behind
        _report(cluster, "c1", GLOBAL, lag=lag, batches=batches)
        assert _follow(cluster).endswith(
            f"({'edge-d'}: {GLOBAL} has not read all that edge-d sent yet)"
        )
    assert _kinds(cluster).count("site-draining") == 1 and "pipeline-upgrade" not in _kinds(cluster)

    _report(cluster, "c1", GLOBAL, lag=0, batches=12)
    assert _follow(cluster) == "site edge-d left (drained): upgrading"
    (asked,) = [e for e in cluster.c.log if e.kind == "pipeline-upgrade"]
    assert asked.because == "site edge-d left (drained)"
    dropped = {(s["step"], s["verdict"]) for s in asked.steps if s["sink"] == "out"}
    assert any(verdict == "dropped" for _, verdict in dropped)
    upgrade = cluster.state.pipelines["p1"].upgrade
    assert upgrade == cluster.state.pipelines["p1"].spec  # the same version, planned again


def test_a_site_fragment_that_reads_more_after_the_mark_is_marked_again() -> None:
    cluster = _stream_undeclared(_four_running())
    _report(cluster, "d4", LOCAL, lag=0, rows_in=100)
    _report(cluster, "c1", GLOBAL, lag=0, batches=10)
    _follow(cluster)
    _report(cluster, "d4", LOCAL, lag=0, rows_in=130)  # a late device's readings
    _report(cluster, "c1", GLOBAL, lag=0, batches=12)
    assert _follow(cluster) == "site edge-d left: draining (marked)"
    mark = cluster.state.pipelines["p1"].draining["edge-d"]
    assert (mark.global_batches, mark.site_rows_in) == ({GLOBAL: 12}, 130)
    _report(cluster, "c1", GLOBAL, lag=0, batches=14)
    assert _follow(cluster).endswith(": upgrading")


def test_a_site_whose_node_was_removed_waits_for_the_global_fragment_alone() -> None:
    cluster = _four_running()
    _report(cluster, "c1", GLOBAL, lag=0, batches=7)
    cluster.c.decide(lambda tx: registry.remove(tx, "d4"))
    assert _follow(cluster) == "site edge-d left: draining (marked)"
    assert cluster.state.pipelines["p1"].draining["edge-d"].site_rows_in == 0
    _report(cluster, "c1", GLOBAL, lag=0, batches=9)
    _report(cluster, "a1", "p1.at-edge-a", lag=0)
    _report(cluster, "c3", "p1.at-edge-c", lag=0)
    assert _follow(cluster) == "site edge-d left (drained): upgrading"
    assert cluster.state.pipelines["p1"].state == PipelineState.STOPPING


def test_an_upgrade_starts_the_new_plan_with_no_site_draining() -> None:
    cluster = _stream_undeclared(_four_running())
    _report(cluster, "d4", LOCAL, lag=0, rows_in=1)
    _report(cluster, "c1", GLOBAL, lag=0, batches=1)
    _follow(cluster)
    _report(cluster, "c1", GLOBAL, lag=0, batches=3)
    _follow(cluster)
    cluster.c.decide(
        lambda tx: tx.add(
            pipelines.r.PipelineStateChanged,
            pipeline="p1",
            state=PipelineState.STOPPED,
            reason="stopped at its savepoint",
        )
    )
    cluster.c.decide(lambda tx: pipelines.finish_upgrade(tx, "p1"))
    assert cluster.state.pipelines["p1"].draining == {}


def test_nothing_is_marked_before_every_global_fragment_has_reported() -> None:
    cluster = _stream_undeclared(_four_running())
    _report(cluster, "d4", LOCAL, lag=0, rows_in=3)
    view = drains.drains(
        cluster.state, cluster.state.pipelines["p1"], ["edge-d"], lambda _: None, 0.0
    )
    assert not view.drained and view.marks == []
    assert view.waiting == {"edge-d": f"no report yet from {LOCAL}"}


def test_two_sites_becoming_one_is_drained_but_not_followed() -> None:
    cluster = _three_running()
    cluster.c.decide(lambda tx: registry.put_node(tx, NodeSpec(name="c3", site="edge-c")))
    _report(cluster, "c3", "p1.at-edge-c", lag=0, rows_in=4)
    _report(cluster, "c1", GLOBAL, lag=0, batches=1)
    _follow(cluster)
    _report(cluster, "c1", GLOBAL, lag=0, batches=3)
    outcome = _follow(cluster)
    assert outcome.startswith("site edge-c left (drained): not followed")
    assert "would move from fragment 'p1.global' to 'p1.f0'" in outcome
    assert cluster.state.pipelines["p1"].upgrade is None  # the old plan runs on
