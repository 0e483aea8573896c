"""What the REST API reads of a coordinator: its state and what nodes report, as of
now. Read-only, and no I/O: every answer is computed from the replica's state, the
observations its subscriptions keep, and its clock.

The coordinator keeps one :class:`ClusterView` (``coordinator.view``); the view reads
through the coordinator each time, because a replica's state object is replaced when
it recovers the control log.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from spanflow.clock import Clock
from spanflow.control import pipelines, registry, views
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Observed
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.protocol.rest import (
    ClusterInfo,
    ClusterMetrics,
    Connection,
    FragmentPlan,
    Health,
    NodeStatus,
    PipelineMetrics,
    PipelineStatus,
)
from spanflow.spec.cluster import NodeRecord, PipelineRecord, PipelineState
from spanflow.spec.topology import Topology


class Replica(Protocol):
    """What a view reads of the coordinator replica it shows."""

    settings: CoordinatorSettings
    state: ClusterState
    observed: Observed
    clock: Clock
    started_at: float
    recovered_records: int
    leader_url: str | None
    lease_seconds: float

    @property
    def role(self) -> Literal["leader", "standby"]: ...


class ClusterView:
    """Every read the REST API answers, from one replica (leader or standby)."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    @property
    def _state(self) -> ClusterState:
        return self._replica.state

    @property
    def _observed(self) -> Observed:
        return self._replica.observed

    # -- the replica ---------------------------------------------------------------------
    def health(self) -> Health:
        return Health(ok=True, nodes=len(self._state.nodes), **self._who())

    def info(self) -> ClusterInfo:
        r, s = self._replica, self._replica.settings
        settings = ("nats_url", "hub_domain", "heartbeat_interval", "failure_after", "state_dir")
        return ClusterInfo(
            **self._who(),
            **{name: getattr(s, name) for name in settings},
            recovered_log_records=r.recovered_records,
            log_sequence=self._state.applied,
            leader_epoch=self._state.leader_epoch,
            leader_url=r.leader_url,
            lease_seconds=r.lease_seconds,
            token_required=s.token is not None,
        )

    def _who(self) -> dict[str, Any]:
        """This replica, its role and the leader, as every answer about it says."""
        r = self._replica
        return {"name": r.settings.name, "role": r.role, "leader": self._state.leader}

    # -- nodes and topology --------------------------------------------------------------
    def topology(self) -> Topology:
        return self._state.full_topology()

    def node(self, name: str) -> NodeRecord:
        return registry.node(self._state, name)

    def connection_for(self, node: str) -> Connection:
        s = self._replica.settings
        return registry.connection_for(self._state, node, s.nats_url, s.hub_domain, s.replicas)

    def node_statuses(self) -> list[NodeStatus]:
        at = self.reach()
        return [
            views.node_status(self._state, self._observed, n, at) for n in sorted(self._state.nodes)
        ]

    def node_status(self, name: str) -> NodeStatus:
        return views.node_status(self._state, self._observed, name, self.reach())

    # -- pipelines -----------------------------------------------------------------------
    def pipeline(self, name: str) -> PipelineRecord:
        return pipelines.pipeline(self._state, name)

    def pipeline_statuses(self) -> list[PipelineStatus]:
        at = self.reach()
        return [
            views.pipeline_status(self._state, self._observed, n, at)
            for n in sorted(self._state.pipelines)
        ]

    def pipeline_status(self, name: str) -> PipelineStatus:
        return views.pipeline_status(self._state, self._observed, name, self.reach())

    def pipeline_metrics(self, name: str) -> PipelineMetrics:
        return views.pipeline_metrics(self._state, self._observed, name, self.reach())

    def planned_fragments(self) -> list[tuple[str, str, str | None]]:
        """(pipeline, fragment, node or None when unplaced) of every fragment an active
        pipeline should be running."""
        out = []
        for name in sorted(self._state.pipelines):
            record = self._state.pipelines[name]
            if record.state.terminal or record.state == PipelineState.STOPPED:
                continue
            for f in record.fragments:
                a = self._state.assignments.get(f.id)
                out.append((name, f.id, a.node if a else None))
        return out

    def plan(self, pipeline: str) -> list[FragmentPlan]:
        """The fragments ``pipeline`` was cut into, each with where it runs and its own
        steps — those the planner added included (a site's partial aggregate, the read
        of another fragment's output) — secrets masked (NotFound)."""
        record = pipelines.pipeline(self._state, pipeline)
        out = []
        for f in pipelines.shown_fragments(self._state, record):
            a = self._state.assignments.get(f.id)
            steps = f.spec.secret_free()["steps"]
            node = a.node if a else None
            out.append(FragmentPlan(id=f.id, kind=f.kind, site=f.site, node=node, steps=steps))
        return out

    def shown_fragments(self, pipeline: str) -> list[str]:
        """The ids of the fragments the dashboard shows for ``pipeline`` (NotFound)."""
        record = pipelines.pipeline(self._state, pipeline)
        return [f.id for f in pipelines.shown_fragments(self._state, record)]

    # -- figures -------------------------------------------------------------------------
    def reach(self) -> views.Reach:
        """Which nodes can be believed now (every view takes it)."""
        r = self._replica
        return views.reach(
            self._state, self._observed, r.clock.monotonic(), r.settings.heartbeat_interval
        )

    def live_runtimes(self) -> dict[str, FragmentRuntime]:
        """Figures of the fragments that run where they can be believed now."""
        return views.live_runtimes(self._state, self._observed, self.reach())

    def cluster_metrics(self) -> ClusterMetrics:
        uptime = self._replica.clock.monotonic() - self._replica.started_at
        return views.cluster_metrics(self._state, self._observed, uptime, self.reach())
