"""Hot standby in the control rooms: where replicas go, and what a node's death does to a
pipeline whose fragments run twice. No NATS, no Spark (tests/cluster has those)."""

from __future__ import annotations

import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.control import pipelines
from spanflow.control.requests import Submission
from spanflow.control.state import Draft
from spanflow.errors import SpecError
from spanflow.spec.cluster import NodeState, PipelineState
from tests.control.test_rooms import Cluster

STANDBY = """\
name: {name}
standby: 1
sources:
  - {{id: src, stream: {stream}, schema: {{x: long}}, to: [out]}}
sinks:
  - {{id: out, type: jetstream, stream: OUT_{upper}, subject: "out.{name}"}}
"""


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def submit_standby(cluster: Cluster, name: str = "p1", stream: str = "SHARED") -> None:
    text = STANDBY.format(name=name, stream=stream, upper=name.upper())
    sub = Submission(spec=load_pipeline_text(text, f"{name}.yaml"))

    def decide(tx: Draft) -> None:
        pipelines.submit(tx, sub, run_id=f"run-{name}")
        cluster.schedule(tx)

    cluster.c.decide(decide)


def test_each_fragment_runs_on_two_nodes_that_agree_their_batches(cluster: Cluster) -> None:
    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    submit_standby(cluster)
    first, second = cluster.state.assignments["p1.f0"], cluster.state.assignments["p1.f0.r1"]
    assert {first.node, second.node} == {"c1", "c2"}
    assert first.batch_plan == second.batch_plan == "run-p1.p1.f0"
    assert first.checkpoint_dir != second.checkpoint_dir  # each replica its own checkpoint
    assert second.fragment.base_id == "p1.f0" and second.fragment.spec == first.fragment.spec
    cluster.beat(
        "c1",
        **{f.fragment.id.replace(".", "__"): "running" for f in (first, second) if f.node == "c1"},
    )
    cluster.beat(
        "c2",
        **{f.fragment.id.replace(".", "__"): "running" for f in (first, second) if f.node == "c2"},
    )
    record = cluster.state.pipelines["p1"]
    assert (record.state, record.reason) == (PipelineState.RUNNING, "all fragments running")
    cluster.assert_replay_matches()


def test_a_standby_waits_for_a_second_node_without_holding_the_pipeline(
    cluster: Cluster,
) -> None:
    cluster.register("c1", "cloud")
    submit_standby(cluster)
    assert cluster.state.assignments["p1.f0"].node == "c1"
    assert "p1.f0.r1" not in cluster.state.assignments  # never beside its other replica
    cluster.beat("c1", p1__f0="running")
    record = cluster.state.pipelines["p1"]
    assert record.state == PipelineState.RUNNING
    assert "standby not running yet: p1.f0" in record.reason
    cluster.register("c2", "cloud")  # the next scheduling pass places it
    assert cluster.state.assignments["p1.f0.r1"].node == "c2"
    cluster.beat("c2", p1__f0__r1="running")
    cluster.beat("c1", p1__f0="running")
    assert cluster.state.pipelines["p1"].reason == "all fragments running"
    cluster.assert_replay_matches()


@pytest.mark.parametrize("dies", ["p1.f0", "p1.f0.r1"])
def test_a_replicas_node_dying_leaves_the_pipeline_running(cluster: Cluster, dies: str) -> None:
    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    submit_standby(cluster)
    dead = cluster.state.assignments[dies].node
    alive = "c2" if dead == "c1" else "c1"
    survivor = "p1.f0.r1" if dies == "p1.f0" else "p1.f0"
    cluster.beat(alive, **{survivor.replace(".", "__"): "running"})
    cluster.beat(dead, **{dies.replace(".", "__"): "running"})
    assert cluster.state.pipelines["p1"].state == PipelineState.RUNNING
    cluster.c.clock.advance(cluster.c.settings.failure_seconds + 0.1)
    cluster.beat(alive, **{survivor.replace(".", "__"): "running"})
    cluster.check()
    assert cluster.state.nodes[dead].state == NodeState.FAILED
    assert dies not in cluster.state.assignments  # no other node: it waits for one
    assert cluster.state.assignments[survivor].node == alive  # untouched, same epoch
    assert cluster.state.assignments[survivor].epoch == 1
    record = cluster.state.pipelines["p1"]
    assert record.state == PipelineState.RUNNING, record.reason
    assert PipelineState.FAILING not in [t.state for t in record.history]
    # A third node comes: the lost replica starts there, never on its partner's node.
    cluster.register("a1", "edge-a")
    replaced = cluster.state.assignments[dies]
    assert replaced.node == "a1" and replaced.epoch == 2
    cluster.assert_replay_matches()


def test_a_single_replica_pipeline_still_fails_over_as_before(cluster: Cluster) -> None:
    """Without standby a node's death makes the pipeline FAILING until it moves."""
    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    cluster.submit("p1", stream="SHARED")
    node = cluster.state.assignments["p1.f0"].node
    other = "c2" if node == "c1" else "c1"
    cluster.c.clock.advance(cluster.c.settings.failure_seconds + 0.1)
    cluster.beat(other)
    cluster.check()
    assert cluster.state.pipelines["p1"].state == PipelineState.FAILING
    assert cluster.state.assignments["p1.f0"].batch_plan is None


def test_a_local_standby_stays_at_its_site(cluster: Cluster) -> None:
    """edge-b keeps its data on its own server: the standby of its local fragment runs
    on another node of edge-b or nowhere, never in the cloud."""
    cluster.register("b1", "edge-b")
    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    submit_standby(cluster, stream="IN_B")
    placed = {fid: a.node for fid, a in cluster.state.assignments.items()}
    assert placed == {"p1.f0": "b1"}


def test_standby_refuses_a_connector_that_cannot_keep_one_copy() -> None:
    """A Kafka source's batches are not agreed between replicas: refused, with its line."""
    text = """\
name: k
standby: 1
sources:
  - id: src
    type: kafka
    options: {bootstrap: "kafka:9092", topic: t}
    schema: {x: long}
    to: [out]
sinks:
  - {id: out, type: jetstream, stream: OUT, subject: "out.x"}
"""
    with pytest.raises(SpecError) as bad:
        load_pipeline_text(text, "k.yaml")
    message = str(bad.value)
    assert "k.yaml" in message and "src" in message
    assert "cannot keep one copy of its batches under two replicas" in message


def test_standby_takes_a_kafka_sink() -> None:
    text = """\
name: k
standby: 1
sources:
  - {id: src, stream: S, schema: {x: long}, to: [out]}
sinks:
  - id: out
    type: kafka
    options: {bootstrap: "kafka:9092", topic: t}
"""
    assert load_pipeline_text(text, "k.yaml").standby == 1


def test_standby_is_zero_or_one() -> None:
    text = STANDBY.format(name="p", stream="S", upper="P").replace("standby: 1", "standby: 2")
    with pytest.raises(SpecError) as bad:
        load_pipeline_text(text, "p.yaml")
    assert "standby" in str(bad.value) and "p.yaml:2" in str(bad.value)


def test_replicas_rows_are_counted_once_in_every_total(cluster: Cluster) -> None:
    """Both replicas read the same rows: a pipeline's and the cluster's totals count the
    replica furthest along, and the per-fragment figures keep both."""
    from spanflow.control import views

    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    submit_standby(cluster)
    ahead = {"source_rows_in": 50, "source_rows_per_s": 10, "rows_in": 50}
    behind = {"source_rows_in": 45, "source_rows_per_s": 9, "rows_in": 45}
    for fid, figures in (("p1.f0", ahead), ("p1.f0.r1", behind)):
        node = cluster.state.assignments[fid].node
        cluster.beat(node, progress={fid: figures}, **{fid.replace(".", "__"): "running"})
    c = cluster.c
    at = views.reach(cluster.state, c.observed, c.clock.monotonic(), c.settings.heartbeat_interval)
    status = views.pipeline_status(cluster.state, c.observed, "p1", at)
    metrics = views.pipeline_metrics(cluster.state, c.observed, "p1", at)
    totals = views.cluster_metrics(cluster.state, c.observed, 0.0, at)
    assert (status.rows_in, metrics.rows_in, totals.throughput_rows_per_s) == (50, 50, 10.0)
    assert sorted(metrics.fragments) == ["p1.f0", "p1.f0.r1"]
    assert {f.id: f.replica for f in status.fragments} == {"p1.f0": 0, "p1.f0.r1": 1}
