"""Views room: what the API shows of the state and of what nodes report. Read-only.

One source of truth for health: :func:`reach` says, at one instant, which nodes can be
believed; every view takes it. A fragment whose node is suspect, dead or never came is
``unreachable`` with its last figures marked stale, and no total (a pipeline's rows,
the cluster's throughput) sums them; a running pipeline with a fragment that does not
run is ``degraded``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spanflow.control import fleet, pipelines, registry
from spanflow.control.state import ClusterState, Observed
from spanflow.plan.planner import hops_of
from spanflow.protocol.messages import Heartbeat
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.protocol.rest import (
    ClusterMetrics,
    FragmentStatus,
    NodeHealth,
    NodeStatus,
    PipelineHealth,
    PipelineMetrics,
    PipelineStatus,
)
from spanflow.spec.cluster import Fragment, NodeRecord, NodeState, PipelineState

UNREACHABLE: frozenset[NodeHealth] = frozenset({"suspect", "dead", "declared"})
"""Node healths whose reports cannot be believed now: silent, failed, or never came."""


@dataclass(frozen=True)
class Reach:
    """How every node is doing at one instant, and how long each has been silent."""

    health: Mapping[str, NodeHealth]
    silent: Mapping[str, float | None]

    def reachable(self, node: str | None) -> bool:
        return node is not None and self.health.get(node, "declared") not in UNREACHABLE


def reach(state: ClusterState, observed: Observed, now: float, heartbeat_s: float) -> Reach:
    """``now``: the monotonic clock; ``heartbeat_s``: the heartbeat period."""
    health, silent = {}, {}
    for name, record in state.nodes.items():
        seen = observed.last_seen.get(name)
        silent[name] = now - seen if seen is not None else None
        health[name] = node_health(
            record, _heartbeat(state, observed, name), silent[name], heartbeat_s
        )
    return Reach(health, silent)


def live_runtime(
    state: ClusterState, observed: Observed, at: Reach, fragment_id: str
) -> FragmentRuntime | None:
    """The fragment's figures if they are of its current assignment and its node can
    be believed now (else None: nothing to sum)."""
    a = state.assignments.get(fragment_id)
    rt = observed.runtime.get(fragment_id)
    if a is None or rt is None or rt.epoch != a.epoch or not at.reachable(a.node):
        return None
    return rt


def live_runtimes(state: ClusterState, observed: Observed, at: Reach) -> dict[str, FragmentRuntime]:
    """:func:`live_runtime` of every fragment that has one."""
    return {
        fid: rt
        for fid in sorted(observed.runtime)
        if (rt := live_runtime(state, observed, at, fid))
    }


def _fragment_state(
    a_node: str | None, assigned: bool, rt: FragmentRuntime | None, current: bool, at: Reach
) -> str:
    if not assigned:
        return "unassigned"
    if not at.reachable(a_node):
        return "unreachable"
    return rt.status if rt is not None and current else "starting"


def pipeline_health(state: PipelineState, fragments: list[FragmentStatus]) -> PipelineHealth:
    """healthy: running and every fragment runs; degraded: running or being repaired
    with a fragment that does not run; else inactive."""
    if state not in (PipelineState.RUNNING, PipelineState.FAILING):
        return "inactive"
    if state == PipelineState.RUNNING and all(f.status == "running" for f in fragments):
        return "healthy"
    return "degraded"


def pipeline_status(
    state: ClusterState, observed: Observed, name: str, at: Reach
) -> PipelineStatus:
    record = pipelines.pipeline(state, name)
    shown = pipelines.shown_fragments(state, record)
    topology = state.topology
    fragments = []
    path = 0.0
    for f in shown:
        a = state.assignments.get(f.id)
        rt = observed.runtime.get(f.id)
        node = state.nodes.get(a.node) if a else None
        worst = (
            max((topology.latency(node.spec.site, s) or 0.0 for s in f.input_sites), default=0)
            if node is not None
            else 0.0
        )
        path = max(path, worst)
        current = rt is not None and a is not None and rt.epoch == a.epoch
        status = _fragment_state(a.node if a else None, a is not None, rt, current, at)
        fragments.append(
            FragmentStatus(
                id=f.id,
                replica=f.replica,
                kind=f.kind,
                site=node.spec.site if node else f.site,
                input_sites=list(f.input_sites),
                steps=list(f.steps),
                node=a.node if a else None,
                epoch=a.epoch if a else record.epochs.get(f.id, 0),
                action=a.action if a else None,
                status=status,
                stale_s=_stale(at, a.node if a else None) if status == "unreachable" else None,
                input_latency_s=round(worst, 4),
                runtime=rt if current else None,
            )
        )
    live = counted_once(
        [(f, rt) for f in shown if (rt := live_runtime(state, observed, at, f.id)) is not None]
    )
    batch_ms = [rt.last_batch_ms for rt in live]
    # Every fragment on the path waits up to a trigger interval and runs one batch;
    # the network adds the worst one-way latency into a global fragment.
    hops = hops_of(shown) if shown else 1
    estimate = path + hops * (record.spec.trigger + max(batch_ms) / 1000) if batch_ms else None
    return PipelineStatus(
        name=name,
        state=record.state,
        health=pipeline_health(record.state, fragments),
        reason=record.reason,
        rows_in=sum(rt.source_rows_in for rt in live),
        input_rows_per_s=round(sum(rt.source_rows_per_s for rt in live), 3),
        latency_estimate_s=round(estimate, 3) if estimate is not None else None,
        over_latency_budget=(
            estimate > record.latency_budget
            if estimate is not None and record.latency_budget
            else None
        ),
        priority=record.priority,
        latency_budget=record.latency_budget,
        parallelism=record.parallelism,
        run_id=record.run_id,
        submitted_at=record.submitted_at,
        savepoint=record.savepoint,
        sites_behind=fleet.sites_behind(state, record),
        fragments=fragments,
        history=list(record.history),
    )


def _stale(at: Reach, node: str | None) -> float | None:
    silent = at.silent.get(node) if node is not None else None
    return round(silent, 1) if silent is not None else None


def pipeline_metrics(
    state: ClusterState, observed: Observed, name: str, at: Reach
) -> PipelineMetrics:
    """Sums over the fragments that run where they can be believed now; rows and rates
    are of the pipeline's own sources (a fragment reading another's output is not
    counted twice)."""
    record = pipelines.pipeline(state, name)
    every = [
        (f, rt)
        for f in pipelines.shown_fragments(state, record)
        if (rt := live_runtime(state, observed, at, f.id)) is not None
    ]
    rts = counted_once(every)
    return PipelineMetrics(
        name=name,
        state=record.state,
        batches=sum(r.batches for r in rts),
        rows_in=sum(r.source_rows_in for r in rts),
        input_rows_per_s=sum(r.source_rows_per_s for r in rts),
        processed_rows_per_s=sum(r.processed_rows_per_s for r in rts),
        realtime_rows_per_s=sum(r.realtime_rows_per_s for r in rts),
        lag=sum(r.lag for r in rts),
        dead_letters=sum(r.dead_letters for r in rts),
        restarts=sum(r.restarts for r in rts),
        last_batch_ms=max((r.last_batch_ms for r in rts), default=0),
        fragments={rt.fragment_id: rt for _, rt in every},
    )


def counted_once(runtimes: list[tuple[Fragment, FragmentRuntime]]) -> list[FragmentRuntime]:
    """One runtime per planned fragment: of hot standby replicas, which read and write
    the same rows, the one furthest along (the others would count its rows again)."""
    best: dict[str, FragmentRuntime] = {}
    for fragment, rt in runtimes:
        held = best.get(fragment.base_id)
        if held is None or rt.source_rows_in > held.source_rows_in:
            best[fragment.base_id] = rt
    return list(best.values())


def node_health(
    record: NodeRecord, hb: Heartbeat | None, silent_s: float | None, heartbeat_s: float
) -> NodeHealth:
    """One word for how a node is doing (see ``NodeStatus.health``)."""
    if record.state == NodeState.FAILED:
        return "dead"
    if record.state != NodeState.ALIVE:
        return "declared" if record.state == NodeState.DECLARED else "draining"
    if hb is not None and any(f.status == "fenced" for f in hb.fragments.values()):
        return "fenced"
    if hb is not None and hb.last_known:
        return "last-known"
    if silent_s is not None and silent_s > 2 * heartbeat_s:
        return "suspect"
    return "alive"


def _heartbeat(state: ClusterState, observed: Observed, name: str) -> Heartbeat | None:
    """The node's last heartbeat, if it is from the agent that runs now (not from the
    one before a restart)."""
    record = state.nodes[name]
    hb = observed.heartbeats.get(name)
    if hb is not None and record.agent_id and hb.agent_id != record.agent_id:
        return None
    return hb


def node_status(state: ClusterState, observed: Observed, name: str, at: Reach) -> NodeStatus:
    record = registry.node(state, name)
    hb = _heartbeat(state, observed, name)
    silent = at.silent.get(name)
    return NodeStatus(
        name=name,
        spec=record.spec,
        state=record.state,
        health=at.health[name],
        agent_id=record.agent_id,
        host=record.host,
        since=record.since,
        fragments=sorted(a.fragment.id for a in state.assignments_on(name)),
        running=sorted(hb.fragments) if hb else [],
        agent_fragments=dict(hb.fragments) if hb else {},
        slots=record.spec.capabilities.fragment_slots,
        slots_used=sum(
            a.fragment.slots_on(record.spec.capabilities) for a in state.assignments_on(name)
        ),
        cpu_percent=hb.cpu_percent if hb else None,
        memory_percent=hb.memory_percent if hb else None,
        last_heartbeat_s=round(silent, 2) if silent is not None else None,
        streams=list(hb.streams) if hb else [],
        warnings=[u.warning for u in hb.streams if u.warning] if hb else [],
        last_known_assignments=hb.last_known if hb else False,
        ready=hb.ready if hb else False,
        load=hb.load if hb else None,
        bottleneck=hb.bottleneck if hb else None,
        gossip_addr=record.gossip,
        gossip_rejected=hb.gossip_rejected if hb else 0,
        gossip=dict(sorted(hb.peers.items())) if hb else {},
        executors=record.executors,
    )


def cluster_metrics(
    state: ClusterState, observed: Observed, uptime_s: float, at: Reach
) -> ClusterMetrics:
    nodes = state.nodes.values()
    by_state: dict[str, int] = {s.value: 0 for s in NodeState}
    for n in nodes:
        by_state[n.state.value] += 1
    live = [n for n in nodes if n.state in (NodeState.ALIVE, NodeState.DRAINING)]
    slots = sum(n.spec.capabilities.fragment_slots for n in live)
    cores = sum(n.spec.capabilities.cores for n in live)
    used = sum(
        a.fragment.slots_on(state.nodes[a.node].spec.capabilities)
        for a in state.assignments.values()
        if a.node in state.nodes
    )
    cpus = [
        observed.heartbeats[n.name].cpu_percent
        for n in live
        if n.name in observed.heartbeats and at.reachable(n.name)
    ]
    once = counted_once(
        [
            (a.fragment, rt)
            for fid, rt in live_runtimes(state, observed, at).items()
            if (a := state.assignments.get(fid)) is not None
        ]
    )
    by_pipeline_state: dict[str, int] = {s.value: 0 for s in PipelineState}
    for p in state.pipelines.values():
        by_pipeline_state[p.state.value] += 1
    return ClusterMetrics(
        nodes=by_state,
        cores=cores,
        slots=slots,
        slots_used=used,
        utilisation=round(used / slots, 3) if slots else 0.0,
        cpu_percent=round(sum(cpus) / len(cpus), 1) if cpus else 0.0,
        throughput_rows_per_s=round(sum(r.source_rows_per_s for r in once), 1),
        pipelines=by_pipeline_state,
        uptime_s=round(uptime_s, 1),
        leader=state.leader,
        leader_epoch=state.leader_epoch,
    )
