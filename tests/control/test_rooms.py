"""The control rooms' decisions, without NATS or Spark: an in-memory log and a fake clock.

Each test drives requests and node reports through the rooms the way the coordinator's
shell composes them, checks the records decided, and that replaying the log (through
JSON, as a standby reads it) rebuilds exactly the same state.
"""

from __future__ import annotations

import pytest

from spanflow.api.topology_loader import load_topology_text
from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.control import (
    pipelines,
    rebalancer,
    reconciler,
    registry,
    scheduler,
    topology_manager,
)
from spanflow.control import (
    records as r,
)
from spanflow.control.errors import Conflict, Invalid, NotFound
from spanflow.control.log import projection
from spanflow.control.requests import Registration, Submission
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import Draft, StaleRecord, apply
from spanflow.plan.planner import GeoPlacer
from spanflow.protocol.messages import Activity, Heartbeat, PeerView, ShedRequest
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.protocol.rest import ClusterMetrics, NodeStatus, PipelineMetrics, PipelineStatus
from spanflow.spec.cluster import NodeState, PipelineState

TOPOLOGY = """
sites:
  - {name: edge-a}
  - {name: edge-b, nats_url: "nats://edge-b:4222"}
  - {name: cloud, kind: cloud}
nodes:
  - {name: a1, site: edge-a, streams: [{name: IN_A, subjects: ["in.a.>"]}]}
  - {name: b1, site: edge-b, streams: [{name: IN_B, subjects: ["in.b.>"]}]}
  - {name: c1, site: cloud, capabilities: {cores: 2}}
  - {name: c2, site: cloud, capabilities: {cores: 2}}
links:
  - {between: [edge-a, cloud], latency: 30ms}
  - {between: [edge-b, cloud], latency: 30ms}
"""

PIPELINE = """\
name: {name}
sources:
  - {{id: src, stream: {stream}, schema: {{x: long}}, to: [out]}}
sinks:
  - {{id: out, type: jetstream, stream: OUT_{upper}, subject: "out.{name}"}}
"""

PLACER = GeoPlacer()


class Cluster:
    """The shell's compositions of rooms, over an in-memory log."""

    def __init__(self) -> None:
        from spanflow.testing.control import InMemoryControl

        self.c = InMemoryControl(CoordinatorSettings(nats_url="nats://hub:4222", state_dir="/sp"))
        self.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(TOPOLOGY)))

    @property
    def state(self):  # type: ignore[no-untyped-def]
        return self.c.state

    def schedule(self, tx: Draft) -> None:
        scheduler.schedule(tx, PLACER, self.c.settings, self.c.observed)

    def register(self, name: str, site: str, agent: str | None = None) -> None:
        reg = Registration(name=name, site=site, agent_id=agent or f"agent-{name}")

        def decide(tx: Draft) -> None:
            registry.register(tx, reg)
            self.schedule(tx)

        self.c.decide(decide)
        self.c.observed.joined(name, self.c.clock.monotonic())

    def submit(
        self, name: str, stream: str = "IN_A", budget: float | None = None, priority: int = 0
    ) -> None:
        text = PIPELINE.format(name=name, stream=stream, upper=name.upper())
        spec = load_pipeline_text(text, f"{name}.yaml")
        sub = Submission(spec=spec, latency_budget=budget, priority=priority)

        def decide(tx: Draft) -> None:
            pipelines.submit(tx, sub, run_id=f"run-{name}")
            self.schedule(tx)

        self.c.decide(decide)

    def beat(
        self,
        node: str,
        peers: dict[str, PeerView] | None = None,
        load: float | None = None,
        progress: dict[str, dict[str, float]] | None = None,
        **fragments: str,
    ) -> None:
        """A heartbeat from ``node`` reporting each fragment's status (at its epoch),
        its load, fragments' ``progress`` fields and its membership's view of ``peers``."""
        runtimes = {}
        for fid, status in fragments.items():
            fid = fid.replace("__", ".")
            a = self.state.assignments[fid]
            extra = (progress or {}).get(fid, {})
            runtimes[fid] = FragmentRuntime(fragment_id=fid, epoch=a.epoch, status=status, **extra)  # type: ignore[arg-type]
        hb = Heartbeat(
            node=node,
            agent_id=f"agent-{node}",
            seq=1,
            fragments=runtimes,
            peers=peers or {},
            load=load,
        )
        now = self.c.clock.monotonic()
        if not topology_manager.heard(self.state, self.c.observed, hb, now):
            return

        def decide(tx: Draft) -> bool:
            recovered = topology_manager.recover(tx, node)
            if recovered:
                self.schedule(tx)
            reconciler.refresh_states(tx, self.c.observed)
            return recovered

        if self.c.decide(decide):
            self.c.observed.joined(node, now)

    def check(self) -> list[str]:
        """One pass of the shell's monitor."""
        now = self.c.clock.monotonic()

        def decide(tx: Draft) -> list[str]:
            for name, reason in topology_manager.failures(
                tx.state, self.c.observed, self.c.settings, now
            ):
                topology_manager.fail(
                    tx,
                    name,
                    reason,
                    placer=PLACER,
                    settings=self.c.settings,
                    observed=self.c.observed,
                )
                reconciler.refresh_states(tx, self.c.observed)
            self.schedule(tx)
            return scheduler.rebalance_settled(tx, self.c.observed, self.c.settings, now)

        settled = self.c.decide(decide)
        self.c.observed.unsettled -= set(settled)
        return settled

    def report(self, node: str, fid: str, event: str, status: str, **extra: str) -> None:
        a = self.state.assignments[fid]
        rt = FragmentRuntime(fragment_id=fid, epoch=a.epoch, status=status)  # type: ignore[arg-type]
        act = Activity(node=node, agent_id=f"agent-{node}", event=event, runtime=rt, **extra)  # type: ignore[arg-type]

        def decide(tx: Draft) -> None:
            if reconciler.current_assignment(tx.state, act) is None:
                return
            self.c.observed.runtime[fid] = rt
            reconciler.on_activity(tx, self.c.observed, act, self.c.settings)

        self.c.decide(decide)

    def assert_replay_matches(self) -> None:
        assert projection(self.c.replayed()) == projection(self.state)


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def test_topology_declares_nodes_and_registration_checks_the_site(cluster: Cluster) -> None:
    assert cluster.c.kinds() == ["topology"] + ["node-declared"] * 4
    assert cluster.state.nodes["a1"].state == NodeState.DECLARED
    with pytest.raises(Invalid) as unknown:
        cluster.register("x1", "mars")
    assert unknown.value.code == "unknown_site" and "sites: edge-a, edge-b, cloud" in str(
        unknown.value
    )
    with pytest.raises(Conflict) as wrong:
        cluster.register("a1", "cloud")
    assert wrong.value.code == "wrong_site"
    assert len(cluster.c.log) == 5  # refused requests commit nothing
    cluster.register("a1", "edge-a")
    assert cluster.state.nodes["a1"].state == NodeState.ALIVE
    assert cluster.state.nodes["a1"].spec.streams[0].name == "IN_A"  # kept from the topology
    cluster.assert_replay_matches()


def test_submit_places_fragments_with_epochs_and_checkpoints(cluster: Cluster) -> None:
    cluster.register("a1", "edge-a")
    cluster.submit("p1")
    assert cluster.c.kinds()[-2:] == ["pipeline-submitted", "assign"]
    a = cluster.state.assignments["p1.f0"]
    assert (a.node, a.epoch, a.reason) == ("a1", 1, "placed")
    assert a.checkpoint_dir == "/sp/checkpoints/p1/run-p1/p1.f0"
    record = cluster.state.pipelines["p1"]
    assert record.state == PipelineState.PLANNED and record.epochs == {"p1.f0": 1}
    with pytest.raises(Conflict) as again:
        cluster.submit("p1")
    assert again.value.code == "pipeline_active"
    cluster.beat("a1", p1__f0="running")
    assert cluster.state.pipelines["p1"].state == PipelineState.RUNNING
    cluster.assert_replay_matches()


def test_a_pipeline_no_node_can_ever_run_is_refused_with_its_constraint(
    cluster: Cluster,
) -> None:
    with pytest.raises(Invalid) as bad:
        cluster.submit("p1", budget=0.1)  # a one-second trigger alone is over it
    assert bad.value.code == "unplaceable" and "'p1' cannot be placed" in str(bad.value)
    assert "pipeline-submitted" not in cluster.c.kinds()


def test_silent_node_fails_after_its_periods_and_its_fragment_moves(cluster: Cluster) -> None:
    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    cluster.submit("p1", stream="SHARED")  # a stream no node hosts: any node reads it
    first = cluster.state.assignments["p1.f0"]
    other = "c2" if first.node == "c1" else "c1"
    limit = cluster.c.settings.failure_seconds
    cluster.c.clock.advance(limit - 0.1)
    cluster.beat(other)
    cluster.check()
    assert cluster.state.nodes[first.node].state == NodeState.ALIVE  # not silent long enough
    cluster.c.clock.advance(0.2)
    cluster.beat(other)
    cluster.check()
    assert cluster.state.nodes[first.node].state == NodeState.FAILED
    moved = cluster.state.assignments["p1.f0"]
    assert (moved.node, moved.epoch, moved.reason) == (other, 2, "re-placed")
    assert moved.checkpoint_dir == first.checkpoint_dir  # resumes from its checkpoint
    assert cluster.state.pipelines["p1"].state == PipelineState.FAILING
    kinds = cluster.c.kinds()
    assert kinds[-4:] == ["node-failed", "unassign", "pipeline-state", "assign"]
    cluster.beat(other, p1__f0="running")
    assert cluster.state.pipelines["p1"].state == PipelineState.RUNNING
    # The failed node is heard again: it recovers and settles before it gets work back.
    cluster.beat(first.node)
    assert cluster.state.nodes[first.node].state == NodeState.ALIVE
    assert first.node in cluster.c.observed.unsettled
    cluster.assert_replay_matches()


def two_cloud_nodes(cluster: Cluster) -> tuple[str, str]:
    """c1 and c2 (one partition: the cloud site), p1 on one of them: (its node, other)."""
    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    cluster.submit("p1", stream="SHARED")
    first = cluster.state.assignments["p1.f0"].node
    return first, ("c2" if first == "c1" else "c1")


def test_gossip_declares_a_node_dead_before_its_heartbeats_run_out(cluster: Cluster) -> None:
    node, other = two_cloud_nodes(cluster)
    cluster.c.clock.advance(0.5)  # far less than failure_seconds
    cluster.beat(other, peers={node: PeerView(state="suspect", since_s=0.2)})
    cluster.check()
    assert cluster.state.nodes[node].state == NodeState.ALIVE, "a suspicion is not a verdict"
    cluster.c.clock.advance(0.5)
    cluster.beat(other, peers={node: PeerView(state="dead", since_s=0.1)})
    cluster.check()
    assert cluster.state.nodes[node].state == NodeState.ALIVE, "heard 1 s ago: both must agree"
    cluster.c.clock.advance(0.6)
    cluster.beat(other, peers={node: PeerView(state="dead", since_s=0.7)})
    cluster.check()
    assert cluster.state.nodes[node].state == NodeState.FAILED
    failed = [rec for rec in cluster.c.log if rec.kind == "node-failed"][-1]
    assert failed.reason == f"declared dead by its partition's gossip (reported by {other})"
    assert cluster.state.assignments["p1.f0"].node == other
    cluster.assert_replay_matches()


def test_a_verdict_the_node_outlived_is_ignored(cluster: Cluster) -> None:
    node, other = two_cloud_nodes(cluster)
    cluster.c.clock.advance(1.0)
    cluster.beat(node)  # heard by the coordinator after the verdict below was reached
    cluster.beat(other, peers={node: PeerView(state="dead", since_s=0.5)})
    cluster.check()
    assert cluster.state.nodes[node].state == NodeState.ALIVE


def test_a_node_cut_from_the_coordinator_but_heard_by_its_partition_stays(
    cluster: Cluster,
) -> None:
    node, other = two_cloud_nodes(cluster)
    limit = cluster.c.settings.failure_seconds
    cluster.c.clock.advance(limit + 1.0)
    cluster.beat(other, peers={node: PeerView(state="alive", heard_s=0.3, load_age_s=0.8)})
    cluster.check()
    assert cluster.state.nodes[node].state == NodeState.ALIVE, "alive in its partition"
    cluster.c.clock.advance(1.0)
    stale = PeerView(state="alive", heard_s=limit + 0.5, load_age_s=limit + 0.5)
    cluster.beat(other, peers={node: stale})
    cluster.check()
    assert cluster.state.nodes[node].state == NodeState.FAILED, "nobody hears it any more"
    cluster.assert_replay_matches()


def test_one_peer_cannot_keep_a_node_alive_that_the_rest_of_its_partition_doubts(
    cluster: Cluster,
) -> None:
    """A stolen agent host seals its own heartbeats genuinely and may claim it hears a
    dead peer: while another peer of the partition reports that node suspect or dead,
    the claim keeps nothing alive."""
    node, other = two_cloud_nodes(cluster)
    cluster.register("c3", "cloud")
    cluster.c.clock.advance(cluster.c.settings.failure_seconds + 1.0)
    liar = PeerView(state="alive", heard_s=0.2, load_age_s=0.5)
    cluster.beat(other, peers={node: liar})
    cluster.beat("c3", peers={node: PeerView(state="suspect", since_s=0.4)})
    cluster.check()
    assert cluster.state.nodes[node].state == NodeState.FAILED
    cluster.assert_replay_matches()


def test_a_node_its_peers_hear_but_that_lost_its_data_path_fails(cluster: Cluster) -> None:
    node, other = two_cloud_nodes(cluster)
    cluster.c.clock.advance(cluster.c.settings.failure_seconds + 1.0)
    cut = PeerView(state="alive", heard_s=0.2, load_age_s=0.5, connected=False)
    cluster.beat(other, peers={node: cut})
    cluster.check()
    assert cluster.state.nodes[node].state == NodeState.FAILED, "its NATS connection is down"
    assert cluster.state.assignments["p1.f0"].node == other


def shed(cluster: Cluster, node: str, fragment: str, to: str) -> None:
    cluster.c.decide(
        lambda tx: rebalancer.shed(
            tx,
            node,
            ShedRequest(fragment=fragment, to=to, load=1.3, reason="load 1.30"),
            cluster.c.observed,
            cluster.c.settings,
        )
    )


def test_an_overloaded_node_sheds_a_fragment_to_a_peer_through_a_savepoint(
    cluster: Cluster,
) -> None:
    node, other = two_cloud_nodes(cluster)
    a = cluster.state.assignments["p1.f0"]
    cluster.beat(node, p1__f0="running")
    cluster.beat(other)
    shed(cluster, node, "p1.f0", other)
    moving = cluster.state.assignments["p1.f0"]
    assert (moving.node, moving.action, moving.move_to) == (node, "savepoint", other)
    start = next(x for x in cluster.c.log if isinstance(x, r.MoveStarted))
    assert start.reason == f"shed by {node} (load 1.30)"
    with pytest.raises(Conflict) as again:
        shed(cluster, node, "p1.f0", other)
    assert again.value.code == "moving"
    cluster.report(node, "p1.f0", "savepointed", "stopped", savepoint_dir=moving.savepoint_dir)
    taken = cluster.state.assignments["p1.f0"]
    assert (taken.node, taken.epoch, taken.restore_from) == (other, 2, moving.savepoint_dir)
    assert taken.checkpoint_dir == a.checkpoint_dir and taken.priority == a.priority
    cluster.assert_replay_matches()


def test_shed_requests_the_coordinator_refuses_say_why(cluster: Cluster) -> None:
    node, other = two_cloud_nodes(cluster)
    cluster.register("a1", "edge-a")

    def refused(fragment: str, to: str, by: str = node) -> str:
        with pytest.raises((Conflict, Invalid, NotFound)) as exc:
            shed(cluster, by, fragment, to)
        return exc.value.code

    assert refused("p1.f0", other) == "not_running", "nothing moves before it runs"
    cluster.beat(node, p1__f0="running")
    assert refused("p1.f0", other) == "target_not_ready", "no heartbeat from the peer yet"
    cluster.beat(other)
    cluster.beat("a1")
    assert refused("p1.f0", "a1") == "other_partition"
    assert refused("p1.f0", "zz") == "unknown_node"
    assert refused("p1.f0", node) == "same_node"
    assert refused("p1.f0", node, by=other) == "not_on_node"
    assert "move-start" not in cluster.c.kinds()


def crowded(cluster: Cluster, budget: float | None = None) -> None:
    """c1 alone gets lo (priority 0) and hi (priority 5); then c2 joins."""
    cluster.register("c1", "cloud")
    cluster.submit("lo", stream="SHARED")
    cluster.submit("hi", stream="SHARED", priority=5, budget=budget)
    assert {a.node for a in cluster.state.assignments.values()} == {"c1"}
    cluster.register("c2", "cloud")


def rebalance(cluster: Cluster) -> list[rebalancer.Move]:
    now = cluster.c.clock.monotonic()
    return cluster.c.decide(
        lambda tx: rebalancer.rebalance(tx, cluster.c.observed, cluster.c.settings, now)
    )


def test_the_rebalancer_relieves_a_node_overloaded_for_long(cluster: Cluster) -> None:
    crowded(cluster)
    settings = cluster.c.settings
    batches = {"lo.f0": {"last_batch_ms": 200}, "hi.f0": {"last_batch_ms": 800}}
    cluster.beat("c1", load=1.4, progress=batches, lo__f0="running", hi__f0="running")
    cluster.beat("c2", load=0.05)
    assert rebalance(cluster) == [], "not overloaded for long enough yet"
    cluster.c.clock.advance(settings.overload_sustain + 1)
    cluster.beat("c1", load=1.4, progress=batches, lo__f0="running", hi__f0="running")
    cluster.beat("c2", load=0.05)
    (move,) = rebalance(cluster)
    assert (move.assignment.fragment.id, move.to) == ("lo.f0", "c2"), "lowest priority first"
    start = next(x for x in cluster.c.log if isinstance(x, r.MoveStarted))
    assert start.reason.startswith("rebalanced: c1 at load 1.40 above 0.90 for ")
    cluster.report("c1", "lo.f0", "savepointed", "stopped", savepoint_dir=start.savepoint_dir)
    assert cluster.state.assignments["lo.f0"].node == "c2"
    cluster.beat("c1", load=1.2, hi__f0="running")
    cluster.beat("c2", load=0.3, lo__f0="running")
    assert rebalance(cluster) == [], "hi.f0 alone would take c2 past the underload line"
    cluster.assert_replay_matches()


def test_the_rebalancer_leaves_a_recently_moved_fragment_alone(cluster: Cluster) -> None:
    crowded(cluster, budget=2.0)
    cluster.beat("c1", lo__f0="running", hi__f0="running")
    cluster.beat("c2")
    for source, target in (("c1", "c2"), ("c2", "c1")):  # shed there and back by peers
        shed(cluster, source, "lo.f0", target)
        moving = cluster.state.assignments["lo.f0"]
        cluster.report(
            source, "lo.f0", "savepointed", "stopped", savepoint_dir=moving.savepoint_dir
        )
        cluster.beat(target, lo__f0="running")
    late = {
        "hi.f0": {"batches": 10, "last_batch_ms": 900, "lag": 3000, "processed_rows_per_s": 1000}
    }
    cluster.beat("c1", load=0.8, progress=late, lo__f0="running", hi__f0="running")
    cluster.beat("c2", load=0.05)
    assert rebalance(cluster) == [], "lo.f0 moved within the cool-down: it stays"
    cluster.c.clock.advance(cluster.c.settings.move_cooldown)
    cluster.beat("c1", load=0.8, progress=late, lo__f0="running", hi__f0="running")
    cluster.beat("c2", load=0.05)
    (move,) = rebalance(cluster)
    assert (move.assignment.fragment.id, move.to) == ("lo.f0", "c2"), "after it, it may"


def test_a_fragment_over_its_latency_budget_displaces_lower_priority_work(
    cluster: Cluster,
) -> None:
    crowded(cluster, budget=2.0)
    late = {
        "hi.f0": {"batches": 10, "last_batch_ms": 900, "lag": 3000, "processed_rows_per_s": 1000}
    }
    cluster.beat("c1", load=0.8, progress=late, lo__f0="running", hi__f0="running")
    cluster.beat("c2", load=0.05)
    (move,) = rebalance(cluster)
    assert (move.assignment.fragment.id, move.to) == ("lo.f0", "c2")
    assert "hi.f0 (priority 5) over its latency budget (4.40 s > 2.00 s)" in move.why
    cluster.assert_replay_matches()


def test_a_quiet_rebalancer_pass_re_plans_for_latency(cluster: Cluster) -> None:
    cluster.register("a1", "edge-a")
    cluster.register("c1", "cloud")
    for name in ("p1", "p2", "p3"):
        cluster.submit(name, stream="IN_A")
    where = {a.fragment.pipeline: a.node for a in cluster.state.assignments.values()}
    assert where == {"p1": "a1", "p2": "a1", "p3": "c1"}, "a1 has two slots"
    cluster.c.decide(lambda tx: pipelines.cancel(tx, "p1"))
    cluster.c.clock.advance(cluster.c.settings.settle_seconds + 1)  # joined nodes settle
    cluster.beat("a1", load=0.2, p2__f0="running")
    cluster.beat("c1", load=0.1, p3__f0="running")
    assert rebalance(cluster) == [], "no load to relieve"
    moving = cluster.state.assignments["p3.f0"]
    assert (moving.node, moving.move_to) == ("c1", "a1"), "a1's slot is free: 30 ms closer"
    start = [x for x in cluster.c.log if isinstance(x, r.MoveStarted)][-1]
    assert start.reason.startswith("periodic re-plan: ")
    cluster.assert_replay_matches()


def test_a_cut_off_node_keeps_local_fragments_its_site_server_holds(cluster: Cluster) -> None:
    cluster.register("b1", "edge-b")
    cluster.register("c1", "cloud")
    cluster.submit("p1", stream="IN_B")
    assert cluster.state.assignments["p1.f0"].node == "b1"
    assert cluster.state.assignments["p1.f0"].fragment.kind == "local"
    cluster.c.clock.advance(cluster.c.settings.failure_seconds + 1)
    cluster.beat("c1")
    cluster.check()
    assert cluster.state.nodes["b1"].state == NodeState.FAILED
    assert cluster.state.assignments["p1.f0"].node == "b1"  # stranded with its data, kept
    assert cluster.state.pipelines["p1"].state == PipelineState.FAILING
    assert "unreachable: p1.f0 on b1" in cluster.state.pipelines["p1"].reason
    cluster.assert_replay_matches()


def test_a_recovered_node_gets_its_fragment_back_through_a_savepoint(cluster: Cluster) -> None:
    cluster.register("a1", "edge-a")
    cluster.register("c1", "cloud")
    cluster.submit("p1", stream="IN_A")
    assert cluster.state.assignments["p1.f0"].node == "a1"
    cluster.c.clock.advance(cluster.c.settings.failure_seconds + 1)
    cluster.beat("c1")
    cluster.check()  # a1 failed; edge-a has no server of its own: c1 reads IN_A meanwhile
    assert cluster.state.assignments["p1.f0"].node == "c1"
    cluster.beat("c1", p1__f0="running")
    cluster.beat("a1")  # back: 30 ms closer to the data
    assert cluster.state.nodes["a1"].state == NodeState.ALIVE
    cluster.check()
    assert "move-start" not in cluster.c.kinds()  # a1 is still settling
    cluster.c.clock.advance(cluster.c.settings.settle_seconds + 0.5)
    cluster.beat("a1")
    cluster.beat("c1", p1__f0="running")
    assert "a1" in cluster.check()
    moving = cluster.state.assignments["p1.f0"]
    assert (moving.node, moving.action, moving.move_to) == ("c1", "savepoint", "a1")
    assert moving.savepoint_dir == "/sp/savepoints/moves/p1/p1.f0-e2"
    start = next(x for x in cluster.c.log if isinstance(x, r.MoveStarted))
    assert "joined: at edge-a, where IN_A is born" in start.reason
    # A stale report (another savepoint dir) does not finish the move.
    cluster.report("c1", "p1.f0", "savepointed", "stopped", savepoint_dir="/elsewhere")
    assert cluster.state.assignments["p1.f0"].node == "c1"
    cluster.report("c1", "p1.f0", "savepointed", "stopped", savepoint_dir=moving.savepoint_dir)
    home = cluster.state.assignments["p1.f0"]
    assert (home.node, home.epoch, home.action) == ("a1", 3, "run")
    assert home.restore_from == moving.savepoint_dir
    assert home.checkpoint_dir == moving.checkpoint_dir
    assert cluster.c.observed.runtime.get("p1.f0") is None  # the old epoch's report is gone
    cluster.assert_replay_matches()


def test_savepoint_stop_and_resume(cluster: Cluster, tmp_path: object) -> None:
    cluster.register("a1", "edge-a")
    cluster.submit("p1")
    cluster.beat("a1", p1__f0="running")
    cluster.c.decide(lambda tx: pipelines.savepoint(tx, "p1", "/sp/savepoints"))
    record = cluster.state.pipelines["p1"]
    assert record.state == PipelineState.STOPPING
    target = record.savepoint
    assert target is not None and target.startswith("/sp/savepoints/p1/run-p1-")
    assert cluster.state.assignments["p1.f0"].savepoint_dir == f"{target}/p1.f0"
    cluster.report("a1", "p1.f0", "savepointed", "stopped", savepoint_dir=f"{target}/p1.f0")
    assert cluster.state.pipelines["p1"].state == PipelineState.STOPPED
    assert cluster.state.assignments == {}
    with pytest.raises(Invalid) as missing:
        cluster.c.decide(lambda tx: pipelines.resume(tx, "p1", target, exists=False))
    assert missing.value.code == "no_savepoint"

    def resume(tx: Draft) -> None:
        pipelines.resume(tx, "p1", target, exists=True)
        cluster.schedule(tx)

    cluster.c.decide(resume)
    a = cluster.state.assignments["p1.f0"]
    assert (a.epoch, a.restore_from) == (2, f"{target}/p1.f0")
    assert cluster.state.pipelines["p1"].restore_from is None  # used once
    cluster.assert_replay_matches()


def test_cancel_ends_and_a_second_cancel_is_a_conflict(cluster: Cluster) -> None:
    cluster.register("a1", "edge-a")
    cluster.submit("p1")
    cluster.c.decide(lambda tx: pipelines.cancel(tx, "p1"))
    assert cluster.state.pipelines["p1"].state == PipelineState.CANCELED
    assert cluster.state.assignments == {}
    with pytest.raises(Conflict) as again:
        cluster.c.decide(lambda tx: pipelines.cancel(tx, "p1"))
    assert again.value.code == "bad_transition"
    with pytest.raises(NotFound) as nothing:
        cluster.c.decide(lambda tx: pipelines.cancel(tx, "nope"))
    assert nothing.value.code == "no_pipeline"
    cluster.submit("p1")  # a canceled pipeline can be submitted again
    assert cluster.state.pipelines["p1"].state == PipelineState.PLANNED


def test_a_replaced_agents_heartbeat_is_ignored(cluster: Cluster) -> None:
    cluster.register("a1", "edge-a", agent="agent-a1")
    cluster.register("a1", "edge-a", agent="agent-new")
    hb = Heartbeat(node="a1", agent_id="agent-a1", seq=9)
    assert topology_manager.heard(cluster.state, cluster.c.observed, hb, 0.0) is None


def test_drain_and_remove_move_fragments_off(cluster: Cluster) -> None:
    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    cluster.submit("p1", stream="SHARED")
    node = cluster.state.assignments["p1.f0"].node

    def drain(tx: Draft) -> None:
        if registry.drain(tx, node):
            scheduler.move_fragments_off(
                tx,
                node,
                reason=f"node {node} drained",
                placer=PLACER,
                settings=cluster.c.settings,
                observed=cluster.c.observed,
            )

    cluster.c.decide(drain)
    assert cluster.state.nodes[node].state == NodeState.DRAINING
    assert cluster.state.assignments["p1.f0"].node != node
    before = len(cluster.c.log)
    cluster.c.decide(drain)  # already draining: nothing to decide
    assert len(cluster.c.log) == before
    cluster.c.decide(lambda tx: registry.remove(tx, node))
    assert node not in cluster.state.nodes
    cluster.assert_replay_matches()


def test_records_of_a_deposed_leader_are_refused() -> None:
    from spanflow.control.state import ClusterState

    state = ClusterState()
    apply(state, r.LeaderElected(at=1.0, epoch=3, leader="coord-2"))
    assert (state.leader, state.leader_epoch) == ("coord-2", 3)
    stale = r.NodeRemoved(at=2.0, epoch=2, node="a1")
    with pytest.raises(StaleRecord, match="epoch 2; the leader's epoch is 3"):
        apply(state, stale)


def test_every_record_kind_is_named_once_and_round_trips() -> None:
    assert len(set(r.RECORD_KINDS)) == len(r.RECORD_KINDS) == len(r.RECORD_CLASSES)
    record = r.NodeFailed(at=5.0, epoch=1, node="a1", reason="no heartbeat for 3.2 s")
    assert r.decode(r.encode(record)) == record
    with pytest.raises(ValueError, match="kind"):
        r.decode(b'{"kind": "nonsense", "at": 1.0}')


def test_leadership_steps_and_office() -> None:
    from spanflow.control.leadership import Lease, Step, next_step, take_office
    from spanflow.control.state import ClusterState

    assert next_step("c1", None) == Step.CAMPAIGN
    assert next_step("c1", Lease(holder="c1", revision=7)) == Step.RENEW
    assert next_step("c1", Lease(holder="c2", revision=7)) == Step.FOLLOW
    assert (
        Lease(holder="c1", url="http://x", revision=9).value()
        == b'{"holder":"c1","url":"http://x"}'
    )
    state = ClusterState()
    tx = take_office(state, "c1", at=5.0)
    assert [(x.kind, x.epoch) for x in tx.records] == [("leader", 1)]
    for record in tx.records:
        apply(state, record)
    assert take_office(state, "c1", at=6.0).records == []  # its own restart: same epoch
    other = take_office(state, "c2", at=7.0)
    assert [(x.kind, x.epoch) for x in other.records] == [("leader", 2)]
    assert other.add(r.NodeRemoved, node="a1").epoch == 2  # its later records carry it


def test_the_lease_outlives_jetstream_failover() -> None:
    from spanflow.control.leadership import (
        JETSTREAM_FAILOVER,
        LEASE_CALL_TIMEOUT,
        LEASE_RETRY,
        RENEWALS_PER_LEASE,
        keeps_office,
        lease_for,
    )

    assert lease_for(1) == 3.0  # one server: nothing to fail over
    lease = lease_for(3)
    # after its last renewal a leader may go a renewal period plus a whole failover
    # without an answer, and its first retry after that must land while it still leads
    renewed_by = lease / RENEWALS_PER_LEASE + JETSTREAM_FAILOVER + LEASE_RETRY
    assert keeps_office(last_renewed=0.0, now=renewed_by + LEASE_CALL_TIMEOUT, lease_seconds=lease)
    assert lease == 19.0
    assert keeps_office(last_renewed=100.0, now=118.0, lease_seconds=lease)
    assert not keeps_office(last_renewed=100.0, now=118.6, lease_seconds=lease)
    assert not keeps_office(last_renewed=float("-inf"), now=0.0, lease_seconds=lease)


def test_a_restarted_agents_status_is_not_its_predecessors(cluster: Cluster) -> None:
    from spanflow.control import views

    cluster.register("a1", "edge-a", agent="agent-a1")
    cluster.beat("a1")  # the first agent: ready, its Spark up
    now = cluster.c.clock.monotonic()

    def status_now() -> NodeStatus:
        at = views.reach(cluster.state, cluster.c.observed, now, 1.0)
        return views.node_status(cluster.state, cluster.c.observed, "a1", at)

    assert status_now().ready is True
    cluster.register("a1", "edge-a", agent="agent-restarted")  # starting its Spark
    status = status_now()
    assert status.ready is False and status.cpu_percent is None


def test_a_silent_nodes_fragment_is_unreachable_and_left_out_of_every_total(
    cluster: Cluster,
) -> None:
    """One source of truth for health: from the moment a node is silent for two
    heartbeats its fragment is unreachable (its last figures kept, marked stale), the
    pipeline degraded, and no total sums it; after the move it counts again."""
    from spanflow.control import views

    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    cluster.submit("p1", stream="SHARED")
    first = cluster.state.assignments["p1.f0"]
    other = "c2" if first.node == "c1" else "c1"
    figures = {"rows_in": 40, "source_rows_in": 40, "input_rows_per_s": 8, "source_rows_per_s": 8}
    cluster.beat(first.node, progress={"p1.f0": figures}, p1__f0="running")
    cluster.beat(other)

    def view() -> tuple[PipelineStatus, PipelineMetrics, ClusterMetrics, NodeStatus]:
        c = cluster.c
        at = views.reach(
            cluster.state, c.observed, c.clock.monotonic(), c.settings.heartbeat_interval
        )
        return (
            views.pipeline_status(cluster.state, c.observed, "p1", at),
            views.pipeline_metrics(cluster.state, c.observed, "p1", at),
            views.cluster_metrics(cluster.state, c.observed, 0.0, at),
            views.node_status(cluster.state, c.observed, first.node, at),
        )

    status, metrics, totals, node = view()
    assert (status.health, status.fragments[0].status, node.health) == (
        "healthy",
        "running",
        "alive",
    )
    assert (status.rows_in, metrics.rows_in, totals.throughput_rows_per_s) == (40, 40, 8.0)

    silent = 2 * cluster.c.settings.heartbeat_interval + 0.5
    cluster.c.clock.advance(silent)
    cluster.beat(other)
    status, metrics, totals, node = view()
    fragment = status.fragments[0]
    assert node.health == "suspect" and fragment.status == "unreachable"
    assert fragment.stale_s == pytest.approx(silent, abs=0.05)
    assert fragment.runtime is not None and fragment.runtime.rows_in == 40  # shown, as stale
    assert status.state == PipelineState.RUNNING and status.health == "degraded"
    assert (status.rows_in, status.input_rows_per_s, metrics.rows_in, metrics.fragments) == (
        0, 0.0, 0, {},
    )  # fmt: skip
    assert totals.throughput_rows_per_s == 0.0

    cluster.c.clock.advance(cluster.c.settings.failure_seconds)
    cluster.beat(other)
    cluster.check()
    status, *_ = view()
    assert (status.fragments[0].node, status.fragments[0].status) == (other, "starting")
    assert status.health == "degraded"  # until it runs again
    cluster.beat(other, progress={"p1.f0": figures}, p1__f0="running")
    status, metrics, totals, _ = view()
    assert (status.health, status.rows_in, totals.throughput_rows_per_s) == ("healthy", 40, 8.0)


def test_a_move_savepoint_in_nats_goes_to_the_targets_domain(cluster: Cluster) -> None:
    """With ``jetstream://`` state each site's nodes use their own server's store: a
    move's savepoint is written into the target's (its site's domain, else the hub's),
    which the old node reaches over the leaf link."""
    from dataclasses import replace

    from spanflow.spec.cluster import Assignment
    from spanflow.spec.locations import in_domain

    cluster.register("a1", "edge-a")
    cluster.register("b1", "edge-b")
    cluster.register("c1", "cloud")
    cluster.submit("p1")
    a: Assignment = cluster.state.assignments["p1.f0"]
    settings = replace(
        cluster.c.settings, state_dir="jetstream://spanflow/cluster", hub_domain="hub"
    )
    to_b = scheduler.move_savepoint(cluster.state, settings, a, "b1")
    assert to_b == f"jetstream://edge-b@spanflow/cluster/savepoints/moves/p1/p1.f0-e{a.epoch}"
    to_cloud = scheduler.move_savepoint(cluster.state, settings, a, "c1")
    assert to_cloud.startswith("jetstream://hub@spanflow/cluster/savepoints/moves/p1/")
    # a directory, or a location already pinned, is left as it is
    assert scheduler.move_savepoint(cluster.state, cluster.c.settings, a, "b1").startswith("/sp/")
    assert in_domain("jetstream://x@spanflow/a", "edge-b") == "jetstream://x@spanflow/a"
    assert in_domain("hdfs://nn:8020/a", "edge-b") == "hdfs://nn:8020/a"


def test_a_sites_state_holds_its_fragments_checkpoints_and_a_move_changes_it(
    cluster: Cluster,
) -> None:
    """edge-b keeps state on its own HDFS (`state:`); the cloud uses --state-dir. A
    fragment at edge-b checkpoints there; moved to the cloud, its savepoint goes to the
    cloud's root and it resumes with a checkpoint under that root."""
    with_state = TOPOLOGY.replace(
        '{name: edge-b, nats_url: "nats://edge-b:4222"}',
        '{name: edge-b, nats_url: "nats://edge-b:4222", state: "hdfs://nn-b:8020/spanflow"}',
    )
    cluster.c.decide(lambda tx: registry.merge_topology(tx, load_topology_text(with_state)))
    cluster.register("b1", "edge-b")
    cluster.register("c1", "cloud")
    cluster.submit("p1", stream="IN_B")
    a = cluster.state.assignments["p1.f0"]
    assert a.node == "b1"
    assert a.checkpoint_dir == "hdfs://nn-b:8020/spanflow/checkpoints/p1/run-p1/p1.f0"

    settings = cluster.c.settings
    cluster.c.decide(lambda tx: scheduler.start_move(tx, a, "c1", "test", settings))
    moving = cluster.state.assignments["p1.f0"]
    assert moving.savepoint_dir == "/sp/savepoints/moves/p1/p1.f0-e1"
    cluster.c.decide(lambda tx: scheduler.finish_move(tx, moving, settings))
    moved = cluster.state.assignments["p1.f0"]
    assert (moved.node, moved.epoch) == ("c1", 2)
    assert moved.checkpoint_dir == "/sp/checkpoints/p1/run-p1/p1.f0"
    assert moved.restore_from == moving.savepoint_dir
    cluster.assert_replay_matches()


def test_a_node_that_dies_during_a_savepoint_has_its_checkpoint_saved_by_another(
    cluster: Cluster,
) -> None:
    """The stopping pipeline's fragment on the dead node is not left unsaved: a live
    node copies its last checkpoint to the savepoint, and only then is it stopped."""
    cluster.register("c1", "cloud")
    cluster.register("c2", "cloud")
    cluster.submit("p1", stream="SHARED")
    first = cluster.state.assignments["p1.f0"]
    other = "c2" if first.node == "c1" else "c1"
    cluster.beat(first.node, p1__f0="running")
    cluster.c.decide(lambda tx: pipelines.savepoint(tx, "p1", "/sp/savepoints"))
    saving = cluster.state.assignments["p1.f0"]
    assert saving.action == "savepoint" and saving.savepoint_dir is not None

    cluster.c.clock.advance(cluster.c.settings.failure_seconds + 0.1)
    cluster.beat(other)
    cluster.check()
    assert cluster.state.nodes[first.node].state == NodeState.FAILED
    record = cluster.state.pipelines["p1"]
    assert record.state == PipelineState.STOPPING  # not stopped without that savepoint
    taken = cluster.state.assignments["p1.f0"]
    assert (taken.node, taken.epoch, taken.action) == (other, 2, "savepoint")
    assert taken.savepoint_dir == saving.savepoint_dir
    assert taken.checkpoint_dir == first.checkpoint_dir  # where the dead node's data is
    cluster.report(other, "p1.f0", "savepointed", "stopped", savepoint_dir=taken.savepoint_dir)
    assert cluster.state.pipelines["p1"].state == PipelineState.STOPPED
    cluster.assert_replay_matches()
