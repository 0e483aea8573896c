"""The pipelines room's upgrades: a new version checked step by step before anything
stops, then a savepoint, then the new version from it (pure, over an in-memory log)."""

from __future__ import annotations

import pytest

import spanflow as sf
from spanflow.control import pipelines
from spanflow.control.errors import Conflict
from spanflow.control.requests import Submission
from spanflow.control.state import Draft
from spanflow.spec.cluster import PipelineState
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.upgrade import Verdict
from tests.control.test_rooms import Cluster

SCHEMA = {"x": "long", "ts": "timestamp"}


def _version(size: str = "10s", more: bool = False, cloud: bool = False) -> PipelineSpec:
    src = sf.Pipeline("p1").source("IN_A", schema=SCHEMA, event_time="ts", id="src")
    windows = src.window(tumbling=size).aggregate(n="count", id="per_10s")
    if cloud:
        windows = windows.in_cloud()
    flow = windows.sink_jetstream("OUT_P1", subject="out.p1", id="out")
    if more:
        peaks = src.window(tumbling="1m").aggregate(top="max(x)", id="peaks")
        flow = flow.merge(peaks.sink_jetstream("PEAKS_P1", subject="peaks.p1", id="peaks_out"))
    return flow.spec()


@pytest.fixture
def running() -> Cluster:
    cluster = Cluster()
    cluster.register("a1", "edge-a")

    def submit(tx: Draft) -> None:
        pipelines.submit(tx, Submission(spec=_version()), run_id="run-p1")
        cluster.schedule(tx)

    cluster.c.decide(submit)
    cluster.beat("a1", p1__f0="running")
    assert cluster.state.pipelines["p1"].state == PipelineState.RUNNING
    return cluster


def _upgrade(cluster: Cluster, spec: PipelineSpec):  # type: ignore[no-untyped-def]
    return cluster.c.decide(lambda tx: pipelines.upgrade(tx, spec, "/sp/savepoints"))


def test_a_version_that_cannot_keep_the_state_is_refused_before_anything_stops(running) -> None:
    logged = len(running.c.log)
    with pytest.raises(Conflict) as refused:
        _upgrade(running, _version(size="1m"))
    assert refused.value.code == "upgrade_refused"
    message = refused.value.message
    assert message.count("sink 'out', step 'per_10s': refused (size '10s' → '1m'") == 1
    assert len(running.c.log) == logged  # nothing decided
    record = running.state.pipelines["p1"]
    assert (record.state, record.upgrade) == (PipelineState.RUNNING, None)
    assert running.state.assignments["p1.f0"].action == "run"


def test_an_upgrade_takes_a_savepoint_and_starts_the_new_version_from_it(running) -> None:
    report = _upgrade(running, _version(more=True))
    assert {(s.step, s.verdict) for s in report.steps} == {
        ("per_10s", Verdict.KEPT),
        ("peaks", Verdict.ADDED),
    }
    record = running.state.pipelines["p1"]
    assert record.state == PipelineState.STOPPING and record.upgrade is not None
    target = record.savepoint
    assert target is not None
    with pytest.raises(Conflict) as twice:
        _upgrade(running, _version(more=True))
    assert twice.value.code == "upgrade_pending"

    # a coordinator that starts from the log now (the leader was killed) knows the
    # upgrade is under way and finishes it when the savepoint completes
    assert running.c.replayed().pipelines["p1"].upgrade == _version(more=True)
    running.report("a1", "p1.f0", "savepointed", "stopped", savepoint_dir=f"{target}/p1.f0")
    record = running.state.pipelines["p1"]
    assert record.state == PipelineState.CREATED
    assert record.spec == _version(more=True) and record.upgrade is None
    assert running.c.kinds()[-2:] == ["pipeline-stopped", "pipeline-upgraded"]

    running.c.decide(running.schedule)
    placed = running.state.assignments
    assert placed["p1.f0"].restore_from == f"{target}/p1.f0"
    assert "peaks_out" in {s.id for s in placed["p1.f0"].fragment.spec.steps}
    assert placed["p1.f0"].epoch == 2
    running.assert_replay_matches()


def test_only_a_running_pipeline_is_upgraded(running) -> None:
    running.c.decide(lambda tx: pipelines.cancel(tx, "p1"))
    with pytest.raises(Conflict) as ended:
        _upgrade(running, _version(more=True))
    assert ended.value.code == "not_running"


def test_a_stateful_query_the_new_plan_moves_to_another_fragment_is_refused(running) -> None:
    """Pinned to the cloud, the window runs in the global fragment: the step is the same,
    but its state is in the edge fragment's checkpoint, which the global one does not
    start from."""
    running.register("c1", "cloud")
    with pytest.raises(Conflict) as refused:
        _upgrade(running, _version(cloud=True))
    assert "its query would move from fragment 'p1.f0' to 'p1.global'" in refused.value.message
    assert running.state.pipelines["p1"].state == PipelineState.RUNNING


def test_a_pipeline_on_two_sites_upgrades_its_sites_fragments_in_place() -> None:
    """Each site's local fragment runs a query of the same sink id on its own
    checkpoint: that query has not moved between them (such upgrades were refused)."""
    from spanflow.api.topology_loader import load_topology_text
    from spanflow.control import registry
    from tests.control.test_fleet import SITE_C

    cluster = Cluster()
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(SITE_C)))
    for node, site in (("a1", "edge-a"), ("c3", "edge-c"), ("c1", "cloud")):
        cluster.register(node, site)

    def submit(tx: Draft) -> None:
        pipelines.submit(tx, Submission(spec=_version()), run_id="run-p1")
        cluster.schedule(tx)

    cluster.c.decide(submit)
    by_node: dict[str, dict[str, str]] = {}
    for fid, a in cluster.state.assignments.items():  # beat() reads "__" as "."
        by_node.setdefault(a.node, {})[fid.replace(".", "__")] = "running"
    assert len(by_node) == 3
    for node, fragments in by_node.items():
        cluster.beat(node, **fragments)
    assert cluster.state.pipelines["p1"].state == PipelineState.RUNNING
    report = _upgrade(cluster, _version(more=True))
    assert report.ok
    assert cluster.state.pipelines["p1"].upgrade is not None
