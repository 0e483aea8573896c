"""The coordinator's state and the one function that changes it.

:class:`ClusterState` is what the control log says: topology, nodes, pipelines and
assignments. :func:`apply` is its only writer — the leader applies each record it
commits, a recovering coordinator and a standby apply the same records from the log —
so there is one definition of what every decision means.

:class:`Observed` is what nodes report (heartbeats, fragment runtimes, when each was
last heard). It is not logged: any coordinator rebuilds it within a heartbeat period.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from spanflow.control import records as r
from spanflow.protocol.messages import Heartbeat
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.spec.cluster import Assignment, NodeRecord, NodeState, PipelineRecord, PipelineState
from spanflow.spec.topology import Topology


class StaleRecord(Exception):
    """A record written under an older leadership epoch than the state has seen."""


@dataclass
class ClusterState:
    topology: Topology = field(default_factory=Topology)
    """Sites and links; the nodes are ``nodes``."""
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    pipelines: dict[str, PipelineRecord] = field(default_factory=dict)
    assignments: dict[str, Assignment] = field(default_factory=dict)
    """By fragment id."""
    moved_at: dict[str, float] = field(default_factory=dict)
    """By fragment id: when it last started or finished a move (the log's time), so
    the rebalancer leaves recently moved fragments alone."""
    leader: str | None = None
    leader_epoch: int = 0
    applied: int = 0
    """Log sequence of the last record applied."""

    def copy(self) -> ClusterState:
        """A copy whose maps can change without touching this one (values are shared:
        records and assignments are replaced, never mutated)."""
        return replace(
            self,
            nodes=dict(self.nodes),
            pipelines=dict(self.pipelines),
            assignments=dict(self.assignments),
            moved_at=dict(self.moved_at),
        )

    def full_topology(self) -> Topology:
        """Sites, links and every node's spec (sorted by name)."""
        t = self.topology
        return Topology(
            name=t.name,
            sites=t.sites,
            links=t.links,
            nodes=tuple(self.nodes[n].spec for n in sorted(self.nodes)),
        )

    def assignments_of(self, pipeline: str) -> list[Assignment]:
        return [a for a in self.assignments.values() if a.fragment.pipeline == pipeline]

    def assignments_on(self, node: str) -> list[Assignment]:
        return [a for a in self.assignments.values() if a.node == node]


@dataclass
class Observed:
    """What nodes report; volatile. Times are the coordinator's monotonic clock."""

    runtime: dict[str, FragmentRuntime] = field(default_factory=dict)
    """By fragment id: the latest report of the current assignment's epoch."""
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    alive_since: dict[str, float] = field(default_factory=dict)
    """When each node (re)joined or recovered: re-planning waits until it has settled."""
    unsettled: set[str] = field(default_factory=set)
    overloaded_since: dict[str, float] = field(default_factory=dict)
    """Nodes whose heartbeats have reported a load above the overload threshold without
    a break, since when."""

    def joined(self, node: str, at: float) -> None:
        self.last_seen[node] = at
        self.alive_since[node] = at
        self.unsettled.add(node)

    def forget(self, node: str) -> None:
        self.last_seen.pop(node, None)
        self.heartbeats.pop(node, None)

    def forget_runtimes(self, state: ClusterState, node: str) -> None:
        """Drop the figures reported of the fragments assigned to ``node`` (its agent
        was replaced: they were its predecessor's, not what runs now)."""
        for a in state.assignments_on(node):
            self.runtime.pop(a.fragment.id, None)

    def prune(self, state: ClusterState) -> None:
        """Drop runtimes of fragments no longer assigned at the epoch they report."""
        for fid, rt in list(self.runtime.items()):
            a = state.assignments.get(fid)
            if a is None or a.epoch != rt.epoch:
                del self.runtime[fid]

    def current(self, a: Assignment) -> FragmentRuntime | None:
        rt = self.runtime.get(a.fragment.id)
        return rt if rt is not None and rt.epoch == a.epoch else None


R = TypeVar("R", bound=r.Record)


class Draft:
    """Decisions in the making: each record is applied to a private copy of the state
    as it is added, so later decisions of the same request see earlier ones. Only the
    shell commits a draft's records (and applies them to the real state)."""

    def __init__(self, state: ClusterState, at: float, epoch: int = 0) -> None:
        self.state = state.copy()
        self.at = at
        self.epoch = epoch
        self.records: list[r.Record] = []

    def add(self, kind: type[R], **fields: Any) -> R:
        record = kind(at=self.at, epoch=self.epoch, **fields)
        apply(self.state, record)
        self.records.append(record)
        return record


# -- apply ---------------------------------------------------------------------------------
def apply(state: ClusterState, record: r.Record) -> None:
    """Change ``state`` as ``record`` says. Deterministic: no clock, no I/O."""
    if record.epoch < state.leader_epoch:
        raise StaleRecord(
            f"{record.kind} record of epoch {record.epoch}; the leader's epoch is "
            f"{state.leader_epoch}"
        )
    match record:
        case r.TopologyApplied() | r.SitePut() | r.LinkPut():
            state.topology = _topology(state.topology, record)
        case r.NodeDeclared(node=node) | r.NodeRegistered(node=node):
            state.nodes[node.name] = node
        case r.NodeFailed() | r.NodeRecovered() | r.NodeDrained():
            _set_node_state(state, record)
        case r.NodeCapabilitiesChanged(node=name, capabilities=caps):
            old = state.nodes[name]
            spec = old.spec.model_copy(update={"capabilities": caps})
            state.nodes[name] = old.model_copy(update={"spec": spec})
        case r.NodeScaled(node=name, executors=executors):
            if name in state.nodes:
                state.nodes[name] = state.nodes[name].model_copy(update={"executors": executors})
        case r.NodeRemoved(node=name):
            state.nodes.pop(name, None)
        case r.PipelineSubmitted(pipeline=record_):
            state.pipelines[record_.name] = record_
        case r.PipelineStateChanged(pipeline=name, state=to, reason=why, at=at):
            state.pipelines[name] = state.pipelines[name].moved_to(to, why, at)
        case r.PipelineCanceled() | r.PipelineFinished() | r.PipelineFailed() | r.PipelineStopped():
            _end(state, record)
        case r.SavepointStarted():
            _start_savepoint(state, record)
        case r.PipelineResumed(pipeline=name, savepoint=source, at=at):
            moved = state.pipelines[name].moved_to(
                PipelineState.CREATED, f"resuming from {source}", at
            )
            state.pipelines[name] = moved.model_copy(update={"restore_from": source})
        case r.UpgradeRequested(pipeline=name, spec=spec):
            state.pipelines[name] = state.pipelines[name].model_copy(update={"upgrade": spec})
        case r.SiteDraining(pipeline=name, drain=drain):
            leaving = state.pipelines[name]
            draining = {**leaving.draining, drain.site: drain}
            state.pipelines[name] = leaving.model_copy(update={"draining": draining})
        case r.PipelineUpgraded(pipeline=name, savepoint=source, fragments=held, at=at):
            _upgrade(state, name, source, held, at)
        case r.DetectorRebaselined(pipeline=name, step=step, key=key, generation=generation):
            state.pipelines[name] = state.pipelines[name].rebaselined(step, key, generation)
        case r.CatalogChanged():
            pass  # the catalogs keep their own state; the log keeps who changed what, when
        case r.FragmentsAssigned():
            _assign(state, record)
        case r.FragmentsUnassigned(fragments=fragments):
            for fid in fragments:
                state.assignments.pop(fid, None)
        case r.MoveStarted():
            a = state.assignments[record.fragment]
            state.assignments[record.fragment] = a.model_copy(
                update={
                    "action": "savepoint",
                    "savepoint_dir": record.savepoint_dir,
                    "move_to": record.to,
                    "reason": f"moving to {record.to} ({record.reason})",
                }
            )
            state.moved_at[record.fragment] = record.at
        case r.MoveFinished():
            _finish_move(state, record)
            state.moved_at[record.fragment] = record.at
        case r.LeaderElected(leader=leader, epoch=epoch):
            state.leader = leader
            state.leader_epoch = epoch


_NODE_STATES: dict[str, NodeState] = {
    "node-failed": NodeState.FAILED,
    "node-recovered": NodeState.ALIVE,
    "node-drained": NodeState.DRAINING,
}

_ENDED: dict[str, PipelineState] = {
    "pipeline-canceled": PipelineState.CANCELED,
    "pipeline-finished": PipelineState.FINISHED,
    "pipeline-failed": PipelineState.FAILED,
    "pipeline-stopped": PipelineState.STOPPED,
}


def _topology(current: Topology, record: r.TopologyApplied | r.SitePut | r.LinkPut) -> Topology:
    if isinstance(record, r.SitePut):
        return current.with_site(record.site)
    if isinstance(record, r.LinkPut):
        return current.with_link(record.link)
    return Topology(
        name=record.name,
        sites=tuple({s.name: s for s in (*current.sites, *record.sites)}.values()),
        links=tuple({lk.key(): lk for lk in (*current.links, *record.links)}.values()),
    )


def _set_node_state(
    state: ClusterState, record: r.NodeFailed | r.NodeRecovered | r.NodeDrained
) -> None:
    old = state.nodes[record.node]
    state.nodes[record.node] = old.model_copy(
        update={"state": _NODE_STATES[record.kind], "since": record.at}
    )


def _end(state: ClusterState, record: r.PipelineEnded) -> None:
    for a in state.assignments_of(record.pipeline):
        del state.assignments[a.fragment.id]
    old = state.pipelines[record.pipeline]
    state.pipelines[record.pipeline] = old.moved_to(_ENDED[record.kind], record.reason, record.at)


def _upgrade(state: ClusterState, name: str, source: str, held: list[str], at: float) -> None:
    old = state.pipelines[name]
    if old.upgrade is None:
        return
    moved = old.moved_to(PipelineState.CREATED, f"upgraded; resuming from {source}", at)
    state.pipelines[name] = moved.model_copy(
        update={
            "spec": old.upgrade,
            "upgrade": None,
            "fragments": [],
            "draining": {},
            "restore_from": source,
            "restore_fragments": list(held),
        }
    )


def _start_savepoint(state: ClusterState, record: r.SavepointStarted) -> None:
    for a in state.assignments_of(record.pipeline):
        state.assignments[a.fragment.id] = a.model_copy(
            update={
                "action": "savepoint",
                "savepoint_dir": record.fragment_dirs.get(a.fragment.id),
                "move_to": None,
                "reason": "savepoint requested",
            }
        )
    old = state.pipelines[record.pipeline]
    moved = old.moved_to(PipelineState.STOPPING, f"taking savepoint {record.savepoint}", record.at)
    state.pipelines[record.pipeline] = moved.model_copy(update={"savepoint": record.savepoint})


def _assign(state: ClusterState, record: r.FragmentsAssigned) -> None:
    old = state.pipelines[record.pipeline]
    epochs = dict(old.epochs)
    for a in record.assignments:
        state.assignments[a.fragment.id] = a
        epochs[a.fragment.id] = a.epoch
    updated = (
        old.moved_to(PipelineState.PLANNED, "fragments placed", record.at)
        if old.state == PipelineState.CREATED
        else old
    )
    state.pipelines[record.pipeline] = updated.model_copy(
        update={
            "epochs": epochs,
            "restore_from": None,
            "restore_fragments": None,
            "fragments": list(record.plan),
        }
    )


def _finish_move(state: ClusterState, record: r.MoveFinished) -> None:
    a = state.assignments.pop(record.fragment)
    state.assignments[record.fragment] = Assignment(
        fragment=a.fragment,
        node=record.to,
        epoch=record.fragment_epoch,
        checkpoint_dir=record.checkpoint_dir or a.checkpoint_dir,
        restore_from=a.savepoint_dir,
        reason=f"moved from {record.node}",
        priority=a.priority,
        latency_budget=a.latency_budget,
    )
    old = state.pipelines[a.fragment.pipeline]
    epochs = {**old.epochs, record.fragment: record.fragment_epoch}
    state.pipelines[a.fragment.pipeline] = old.model_copy(update={"epochs": epochs})
