"""The coordinator: registry, pipeline manager and failure handling in one asyncio service.

Every decision goes through :meth:`Coordinator._commit`, which appends it to the
write-ahead log and applies it to KV (:mod:`spanflow.control.store`) before the
in-memory view changes. Node agents never talk to the coordinator to learn what to
run: they watch their keys in the assignments bucket. So a coordinator can die and
come back (from nothing but NATS) without any fragment noticing.

Failure detection here is heartbeat-based: a node silent for ``failure_after``
heartbeat periods is marked failed and its fragments are placed elsewhere, resuming
from their checkpoints (which must be on storage every node can reach: see
``docs/cluster.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from pydantic import BaseModel, Field, ValidationError

from spanflow.control.store import ClusterStore, ControlRecord, KVWrite, delete, put
from spanflow.errors import ModelNotFound
from spanflow.ml.model_store import ModelStore
from spanflow.ml.registry import ModelManifest, pin_to_model_needs, scored_models
from spanflow.nats.cluster import (
    ACTIVITY_PREFIX,
    ACTIVITY_STREAM,
    ASSIGNMENTS_BUCKET,
    HEARTBEAT_PREFIX,
    META_BUCKET,
    NODES_BUCKET,
    PIPELINES_BUCKET,
    activity_subject,
)
from spanflow.nats.streams import connect
from spanflow.plan import ClusterView, PlacementError, Placer
from spanflow.plan.fragments import PlanError, compile_fragments
from spanflow.plan.planner import GeoPlacer, hops_of, offline_view, place, plan_pipeline
from spanflow.spec.cluster import (
    TRANSITIONS,
    Activity,
    Assignment,
    Fragment,
    FragmentRuntime,
    Heartbeat,
    NodeRecord,
    NodeState,
    PipelineRecord,
    PipelineState,
    now,
)
from spanflow.spec.durations import Duration
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.retention import DEFAULT_RETENTION
from spanflow.spec.topology import Capabilities, HostedStream, Link, NodeSpec, Site, Topology

log = logging.getLogger(__name__)

ACTIVE = (
    PipelineState.CREATED,
    PipelineState.PLANNED,
    PipelineState.RUNNING,
    PipelineState.FAILING,
)


class RequestError(Exception):
    """A request the coordinator refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class CoordinatorSettings:
    nats_url: str
    state_dir: str = "spanflow-data/cluster"
    """Checkpoints and savepoints: storage every node can reach (one machine: a local dir)."""
    heartbeat_interval: float = 1.0
    hub_domain: str | None = None
    """JetStream domain of the cluster's (hub) server; nodes of sites with their own
    server reach the control plane's buckets and streams through it."""
    failure_after: int = 3
    token: str | None = None
    topology: Topology | None = None
    replan_margin: float = 0.2
    """A fragment moves only when its new place is better by this share of its current
    cost (worst input latency) and by at least a millisecond."""
    settle_heartbeats: int = 10
    """A node that joined or recovered is a move target only after this many heartbeat
    periods alive, so a flapping node does not pull fragments back and forth."""

    @property
    def settle_seconds(self) -> float:
        return self.settle_heartbeats * self.heartbeat_interval

    @property
    def checkpoint_root(self) -> str:
        return str(Path(self.state_dir) / "checkpoints")

    @property
    def savepoint_root(self) -> str:
        return str(Path(self.state_dir) / "savepoints")


class Registration(BaseModel):
    """What a node agent sends when it starts."""

    name: str
    site: str
    agent_id: str
    host: str | None = None
    capabilities: Capabilities | None = Field(
        default=None, description="Given on the agent's command line; wins over the topology."
    )
    detected: Capabilities | None = Field(
        default=None, description="What the agent measured; used when nothing else is known."
    )
    streams: tuple[HostedStream, ...] | None = None
    sinks: tuple[str, ...] | None = None


class Submission(BaseModel):
    spec: PipelineSpec
    priority: int = Field(default=0, ge=0, le=1000)
    latency_budget: Duration | None = Field(default=None, gt=0)
    parallelism: int = Field(default=1, ge=1, le=256)


@dataclass
class _View:
    topology: Topology  # sites and links; nodes come from ``nodes``
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    pipelines: dict[str, PipelineRecord] = field(default_factory=dict)
    assignments: dict[str, Assignment] = field(default_factory=dict)  # by fragment id
    runtime: dict[str, FragmentRuntime] = field(default_factory=dict)  # by fragment id
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    alive_since: dict[str, float] = field(default_factory=dict)
    """When each node (re)joined or recovered: re-planning waits until it has settled."""
    unsettled: set[str] = field(default_factory=set)


class Coordinator:
    def __init__(self, settings: CoordinatorSettings, placer: Placer | None = None) -> None:
        self.settings = settings
        self.placer: Placer = placer or GeoPlacer()
        self.view = _View(topology=Topology())
        self.nc: Client | None = None
        self.store: ClusterStore | None = None
        self.started_at = time.time()
        self.recovered_records = 0
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # -- start-up -------------------------------------------------------------------
    async def start(self) -> None:
        self.nc = await connect(self.settings.nats_url, name="spanflow-coordinator")
        self.store = await ClusterStore.open(self.nc)
        self.recovered_records = await self.store.recover()
        await self._load()
        if self.settings.topology is not None:
            await self._merge_topology(self.settings.topology)
        started = time.monotonic()
        for name, record in self.view.nodes.items():
            if record.state in (NodeState.ALIVE, NodeState.DRAINING):
                self.view.last_seen[name] = started  # a grace period to hear from it
        await self.nc.subscribe(f"{HEARTBEAT_PREFIX}.*", cb=self._on_heartbeat)
        await self.nc.subscribe(f"{ACTIVITY_PREFIX}.>", cb=self._on_activity)
        self._tasks.append(asyncio.create_task(self._monitor(), name="spanflow-monitor"))
        async with self._lock:
            await self._catch_up_savepoints()
            await self._schedule()
        log.info(
            "coordinator up: %d nodes, %d pipelines, %d assignments (%d log records recovered)",
            len(self.view.nodes),
            len(self.view.pipelines),
            len(self.view.assignments),
            self.recovered_records,
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.drain()

    async def _load(self) -> None:
        assert self.store is not None
        meta = await self.store.load(META_BUCKET)
        topology = Topology.model_validate(meta.get("topology", {}))
        nodes = {
            k: NodeRecord.model_validate(v)
            for k, v in (await self.store.load(NODES_BUCKET)).items()
        }
        pipelines = {
            k: PipelineRecord.model_validate(v)
            for k, v in (await self.store.load(PIPELINES_BUCKET)).items()
        }
        assignments = {}
        for value in (await self.store.load(ASSIGNMENTS_BUCKET)).values():
            a = Assignment.model_validate(value)
            assignments[a.fragment.id] = a
        self.view = _View(
            topology=topology, nodes=nodes, pipelines=pipelines, assignments=assignments
        )

    async def _catch_up_savepoints(self) -> None:
        """Savepoints that completed while no coordinator was listening: the agents'
        reports are in the activity log."""
        assert self.nc is not None
        js = self.nc.jetstream()
        for a in list(self.view.assignments.values()):
            if a.action != "savepoint":
                continue
            subject = activity_subject(a.node, a.fragment.id, "savepointed")
            try:
                msg = await js.get_last_msg(ACTIVITY_STREAM, subject)
                act = Activity.model_validate_json(msg.data or b"")
            except (NotFoundError, ValidationError):
                continue
            if act.runtime.epoch == a.epoch and act.savepoint_dir == a.savepoint_dir:
                self.view.runtime[a.fragment.id] = act.runtime
                if a.move_to:
                    await self._finish_move(a)
        for record in list(self.view.pipelines.values()):
            if record.state == PipelineState.STOPPING and self._savepoint_complete(record.name):
                await self._end(record, PipelineState.STOPPED, f"savepoint {record.savepoint}")

    def _savepoint_complete(self, pipeline: str) -> bool:
        return all(
            (rt := self.view.runtime.get(a.fragment.id)) is not None
            and rt.epoch == a.epoch
            and rt.status == "stopped"
            for a in self._assignments_of(pipeline)
        )

    async def _merge_topology(self, given: Topology) -> None:
        """Apply a topology file: its sites, links and node specs win; node states stay."""
        async with self._lock:
            writes: list[KVWrite] = []
            current = self.view.topology
            merged = Topology(
                name=given.name,
                sites=tuple({s.name: s for s in (*current.sites, *given.sites)}.values()),
                links=tuple({lk.key(): lk for lk in (*current.links, *given.links)}.values()),
            )
            if merged != current:
                writes.append(put(META_BUCKET, "topology", merged))
            nodes = dict(self.view.nodes)
            for spec in given.nodes:
                old = nodes.get(spec.name)
                if old is None or old.spec != spec:
                    state = old.state if old else NodeState.DECLARED
                    nodes[spec.name] = NodeRecord(
                        spec=spec,
                        state=state,
                        agent_id=old.agent_id if old else None,
                        host=old.host if old else None,
                    )
                    writes.append(put(NODES_BUCKET, spec.name, nodes[spec.name]))
            if not writes:
                return
            await self._commit("topology", {"topology": given.name}, writes)
            self.view.topology = merged
            self.view.nodes = nodes

    # -- the one way state changes ----------------------------------------------------
    async def _commit(self, kind: str, detail: dict[str, Any], writes: list[KVWrite]) -> int:
        assert self.store is not None
        return await self.store.commit(ControlRecord(kind=kind, detail=detail, writes=writes))

    def topology(self) -> Topology:
        t = self.view.topology
        return Topology(
            name=t.name,
            sites=t.sites,
            links=t.links,
            nodes=tuple(self.view.nodes[n].spec for n in sorted(self.view.nodes)),
        )

    def connection_for(self, node: str) -> dict[str, Any]:
        """Which NATS server a node uses and where the control plane's JetStream is: the
        site's own server (a leaf node) with the hub's domain, or the cluster's; and
        the limits of the streams it creates (its site's)."""
        record = self.node(node)
        site = self.topology().site(record.spec.site)
        own = site.nats_url if site is not None else None
        return {
            "nats_url": own or self.settings.nats_url,
            "control_domain": self.settings.hub_domain if own else None,
            "site_domain": record.spec.site if own else None,
            "retention": (site.retention if site is not None else DEFAULT_RETENTION).model_dump(),
        }

    # -- nodes ----------------------------------------------------------------------
    async def register_node(self, reg: Registration) -> NodeRecord:
        async with self._lock:
            site_names = [s.name for s in self.view.topology.sites]
            if reg.site not in site_names:
                raise RequestError(
                    422, f"unknown site {reg.site!r} (sites: {', '.join(site_names) or 'none'})"
                )
            old = self.view.nodes.get(reg.name)
            if old is not None and old.spec.site != reg.site:
                raise RequestError(
                    409, f"node {reg.name!r} belongs to site {old.spec.site!r}, not {reg.site!r}"
                )
            base = old.spec if old is not None else None
            caps = reg.capabilities or (base.capabilities if base else None) or reg.detected
            try:
                spec = NodeSpec(
                    name=reg.name,
                    site=reg.site,
                    capabilities=caps or Capabilities(),
                    streams=reg.streams
                    if reg.streams is not None
                    else (base.streams if base else ()),
                    sinks=reg.sinks if reg.sinks is not None else (base.sinks if base else ()),
                    local=base.local if base else False,
                )
            except ValidationError as exc:
                raise RequestError(422, str(exc)) from None
            record = NodeRecord(
                spec=spec, state=NodeState.ALIVE, agent_id=reg.agent_id, host=reg.host
            )
            await self._commit(
                "node-registered",
                {"node": reg.name, "agent_id": reg.agent_id, "rejoined": old is not None},
                [put(NODES_BUCKET, reg.name, record)],
            )
            self.view.nodes[reg.name] = record
            self.view.last_seen[reg.name] = time.monotonic()
            self._unsettled(reg.name)
            await self._schedule()
            return record

    async def _set_node_state(
        self, record: NodeRecord, state: NodeState, kind: str, **detail: Any
    ) -> NodeRecord:
        moved = record.model_copy(update={"state": state, "since": now()})
        await self._commit(
            kind, {"node": record.name, **detail}, [put(NODES_BUCKET, record.name, moved)]
        )
        self.view.nodes[record.name] = moved
        return moved

    def node(self, name: str) -> NodeRecord:
        record = self.view.nodes.get(name)
        if record is None:
            raise RequestError(404, f"no node {name!r}")
        return record

    async def drain_node(self, name: str) -> NodeRecord:
        """Move a node's fragments away and give it no new ones (until it re-registers)."""
        async with self._lock:
            record = self.node(name)
            if record.state == NodeState.DRAINING:
                return record
            drained = await self._set_node_state(record, NodeState.DRAINING, "node-drained")
            await self._move_fragments_off(name, reason=f"node {name} drained")
            return drained

    async def remove_node(self, name: str) -> None:
        async with self._lock:
            record = self.node(name)
            await self._move_fragments_off(name, reason=f"node {name} left")
            await self._commit("node-removed", {"node": name}, [delete(NODES_BUCKET, name)])
            del self.view.nodes[record.name]
            self.view.last_seen.pop(name, None)
            self.view.heartbeats.pop(name, None)

    async def update_capabilities(self, name: str, caps: Capabilities) -> NodeRecord:
        async with self._lock:
            record = self.node(name)
            updated = record.model_copy(
                update={"spec": record.spec.model_copy(update={"capabilities": caps})}
            )
            await self._commit(
                "node-capabilities", {"node": name}, [put(NODES_BUCKET, name, updated)]
            )
            self.view.nodes[name] = updated
            await self._schedule()
            await self._rebalance(f"capabilities of {name} changed")
            return updated

    async def put_site(self, site: Site) -> Topology:
        async with self._lock:
            t = self.view.topology.with_site(site)
            await self._commit("site", {"site": site.name}, [put(META_BUCKET, "topology", t)])
            self.view.topology = t
            await self._rebalance(f"site {site.name} changed")
            return self.topology()

    async def put_link(self, link: Link) -> Topology:
        async with self._lock:
            known = {s.name for s in self.view.topology.sites}
            for end in link.between:
                if end not in known:
                    raise RequestError(422, f"link names unknown site {end!r}")
            t = self.view.topology.with_link(link)
            await self._commit(
                "link", {"between": list(link.between)}, [put(META_BUCKET, "topology", t)]
            )
            self.view.topology = t
            await self._rebalance(f"link {'-'.join(link.between)} changed")
            return self.topology()

    # -- pipelines --------------------------------------------------------------------
    def pipeline(self, name: str) -> PipelineRecord:
        record = self.view.pipelines.get(name)
        if record is None:
            raise RequestError(404, f"no pipeline {name!r}")
        return record

    async def submit(self, sub: Submission) -> PipelineRecord:
        async with self._lock:
            name = sub.spec.name
            old = self.view.pipelines.get(name)
            if old is not None and not old.state.terminal and old.state != PipelineState.STOPPED:
                raise RequestError(
                    409, f"pipeline {name!r} is {old.state.value}; cancel it before resubmitting"
                )
            record = PipelineRecord(
                spec=await self._with_model_needs(sub.spec),
                priority=sub.priority,
                latency_budget=sub.latency_budget,
                parallelism=sub.parallelism,
            ).moved_to(PipelineState.CREATED, "submitted")
            self._check_plannable(record)
            await self._commit(
                "pipeline-submitted",
                {"pipeline": name, "run_id": record.run_id, "priority": sub.priority},
                [put(PIPELINES_BUCKET, name, record)],
            )
            self.view.pipelines[name] = record
            await self._schedule()
            return self.view.pipelines[name]

    async def cancel(self, name: str) -> PipelineRecord:
        async with self._lock:
            record = self.pipeline(name)
            self._check_transition(record, PipelineState.CANCELED)
            return await self._end(record, PipelineState.CANCELED, "canceled by request")

    async def savepoint(self, name: str) -> PipelineRecord:
        """Stop every fragment at a consistent checkpoint and keep a copy of it."""
        async with self._lock:
            record = self.pipeline(name)
            if record.state not in (
                PipelineState.RUNNING,
                PipelineState.FAILING,
                PipelineState.PLANNED,
            ):
                raise RequestError(
                    409,
                    f"pipeline {name!r} is {record.state.value}; "
                    "only a running pipeline takes a savepoint",
                )
            target = str(
                Path(self.settings.savepoint_root) / name / f"{record.run_id}-{int(time.time())}"
            )
            writes: list[KVWrite] = []
            for a in self._assignments_of(name):
                updated = a.model_copy(
                    update={
                        "action": "savepoint",
                        "savepoint_dir": str(Path(target) / a.fragment.id),
                        "move_to": None,
                        "reason": "savepoint requested",
                    }
                )
                writes.append(put(ASSIGNMENTS_BUCKET, updated.key, updated))
            moved = record.moved_to(PipelineState.STOPPING, f"taking savepoint {target}")
            moved = moved.model_copy(update={"savepoint": target})
            writes.append(put(PIPELINES_BUCKET, name, moved))
            await self._commit(
                "pipeline-savepoint", {"pipeline": name, "savepoint": target}, writes
            )
            for w in writes:
                if w.bucket == ASSIGNMENTS_BUCKET and w.value is not None:
                    a = Assignment.model_validate_json(w.value)
                    self.view.assignments[a.fragment.id] = a
            self.view.pipelines[name] = moved
            return moved

    async def resume(self, name: str, savepoint: str | None = None) -> PipelineRecord:
        async with self._lock:
            record = self.pipeline(name)
            if record.state != PipelineState.STOPPED:
                raise RequestError(
                    409,
                    f"pipeline {name!r} is {record.state.value}; only a stopped pipeline resumes",
                )
            source = savepoint or record.savepoint
            if source is None or not Path(source).is_dir():
                raise RequestError(422, f"savepoint {source!r} does not exist")
            moved = record.moved_to(PipelineState.CREATED, f"resuming from {source}")
            moved = moved.model_copy(update={"restore_from": source})
            await self._commit(
                "pipeline-resumed",
                {"pipeline": name, "savepoint": source},
                [put(PIPELINES_BUCKET, name, moved)],
            )
            self.view.pipelines[name] = moved
            await self._schedule()
            return self.view.pipelines[name]

    def _check_transition(self, record: PipelineRecord, to: PipelineState) -> None:
        if to not in TRANSITIONS[record.state]:
            raise RequestError(
                409, f"pipeline {record.name!r} is {record.state.value}; cannot move to {to.value}"
            )

    def _assignments_of(self, pipeline: str) -> list[Assignment]:
        return [a for a in self.view.assignments.values() if a.fragment.pipeline == pipeline]

    async def _end(
        self, record: PipelineRecord, state: PipelineState, reason: str
    ) -> PipelineRecord:
        writes = [delete(ASSIGNMENTS_BUCKET, a.key) for a in self._assignments_of(record.name)]
        moved = record.moved_to(state, reason)
        writes.append(put(PIPELINES_BUCKET, record.name, moved))
        await self._commit(
            f"pipeline-{state.value}", {"pipeline": record.name, "reason": reason}, writes
        )
        for a in self._assignments_of(record.name):
            del self.view.assignments[a.fragment.id]
            self.view.runtime.pop(a.fragment.id, None)
        self.view.pipelines[record.name] = moved
        return moved

    async def _set_state(self, record: PipelineRecord, state: PipelineState, reason: str) -> None:
        if record.state == state and record.reason == reason:
            return
        if state != record.state and state not in TRANSITIONS[record.state]:
            log.warning("ignoring %s → %s for %s", record.state, state, record.name)
            return
        moved = record.moved_to(state, reason)
        await self._commit(
            "pipeline-state",
            {"pipeline": record.name, "state": state.value, "reason": reason},
            [put(PIPELINES_BUCKET, record.name, moved)],
        )
        self.view.pipelines[record.name] = moved

    # -- placement --------------------------------------------------------------------
    def _fragments(self, record: PipelineRecord) -> list[Fragment]:
        """The record's plan; a pipeline not planned yet is compiled for today's topology."""
        if record.fragments:
            return record.fragments
        return compile_fragments(record.spec, self.topology(), record.parallelism).fragments

    def _shown_fragments(self, record: PipelineRecord) -> list[Fragment]:
        try:
            return self._fragments(record)
        except PlanError:
            return []

    async def _with_model_needs(self, spec: PipelineSpec) -> PipelineSpec:
        """Pin each score step to nodes that have what its model needs (accelerators,
        tags) as the registry declares; a model not in the registry is refused here
        rather than failing the query where it is placed."""
        names = scored_models(spec)
        if not names:
            return spec
        if self.nc is None:
            raise RequestError(503, "the coordinator is not connected to NATS yet")
        store = ModelStore(self.nc.jetstream())
        manifests: dict[str, ModelManifest] = {}
        for name in names:
            try:
                manifests[name], _ = await store.manifest(name)
            except ModelNotFound:
                raise RequestError(
                    422,
                    f"pipeline {spec.name!r} scores with model {name!r}, which is not in "
                    "the registry: push it first (spanflow model push)",
                ) from None
        return pin_to_model_needs(spec, manifests)

    def _check_plannable(self, record: PipelineRecord) -> None:
        """Refuse a pipeline no placement could ever fit (a bad pin, a latency budget or
        capability no declared node meets), naming the constraint and by how much. A
        pipeline that only waits for nodes to come up or free a slot is accepted."""
        topology = self.topology()
        try:
            compiled = compile_fragments(record.spec, topology, record.parallelism)
            if topology.nodes:
                plan_pipeline(
                    compiled,
                    offline_view(topology),
                    priority=record.priority,
                    latency_budget=record.latency_budget,
                )
        except (PlanError, PlacementError) as exc:
            raise RequestError(422, f"pipeline {record.name!r} cannot be placed: {exc}") from None

    def _cluster_view(self) -> ClusterView:
        used: dict[str, int] = {}
        for a in self.view.assignments.values():
            used[a.node] = used.get(a.node, 0) + 1
        return ClusterView(
            topology=self.topology(),
            nodes=self.view.nodes,
            used_slots=used,
            cpu_percent={n: hb.cpu_percent for n, hb in self.view.heartbeats.items()},
        )

    async def _schedule(self, exclude: Iterable[str] = ()) -> None:
        """Place every fragment of an active pipeline that has no node (highest priority first)."""
        active = [r for r in self.view.pipelines.values() if r.state in ACTIVE]
        active.sort(key=lambda r: (-r.priority, r.submitted_at))
        for record in active:
            try:
                fragments = self._fragments(record)
            except PlanError as exc:
                await self._end(record, PipelineState.FAILED, f"cannot be planned: {exc}")
                continue
            missing = [f for f in fragments if f.id not in self.view.assignments]
            if not missing:
                continue
            try:
                placement = self.placer.place(
                    record, missing, self._cluster_view(), exclude=exclude
                )
            except PlacementError as exc:
                state = (
                    PipelineState.CREATED
                    if record.state == PipelineState.CREATED
                    else PipelineState.FAILING
                )
                await self._set_state(record, state, f"waiting for a node: {exc}")
                continue
            epochs = dict(record.epochs)
            writes: list[KVWrite] = []
            new: list[Assignment] = []
            for fragment in missing:
                epochs[fragment.id] = epochs.get(fragment.id, 0) + 1
                a = Assignment(
                    fragment=fragment,
                    node=placement[fragment.id],
                    epoch=epochs[fragment.id],
                    checkpoint_dir=str(
                        Path(self.settings.checkpoint_root)
                        / record.name
                        / record.run_id
                        / fragment.id
                    ),
                    restore_from=(
                        str(Path(record.restore_from) / fragment.id)
                        if record.restore_from
                        else None
                    ),
                    reason="placed" if epochs[fragment.id] == 1 else "re-placed",
                )
                new.append(a)
                writes.append(put(ASSIGNMENTS_BUCKET, a.key, a))
            updated = (
                record.moved_to(PipelineState.PLANNED, "fragments placed")
                if record.state == PipelineState.CREATED
                else record
            )
            updated = updated.model_copy(
                update={"epochs": epochs, "restore_from": None, "fragments": fragments}
            )
            writes.append(put(PIPELINES_BUCKET, record.name, updated))
            await self._commit(
                "assign",
                {"pipeline": record.name, "placement": {a.fragment.id: a.node for a in new}},
                writes,
            )
            for a in new:
                self.view.assignments[a.fragment.id] = a
            self.view.pipelines[record.name] = updated

    async def _move_fragments_off(self, node: str, *, reason: str, failed: bool = False) -> None:
        """Unassign a node's fragments and place them on other nodes.

        A silent node of a site with its own NATS server keeps its local fragments when
        no other node of the site is live: it is most likely cut off, not dead (its data
        is on the site's server, out of everyone else's reach), and it keeps processing
        and buffering; it picks up where it is when the uplink returns."""
        moving = [a for a in self.view.assignments.values() if a.node == node]
        if failed:
            moving = [a for a in moving if not self._stranded_at_own_site(a, node)]
        if not moving:
            return
        writes = [delete(ASSIGNMENTS_BUCKET, a.key) for a in moving]
        await self._commit(
            "unassign",
            {"node": node, "fragments": [a.fragment.id for a in moving], "reason": reason},
            writes,
        )
        for a in moving:
            del self.view.assignments[a.fragment.id]
            self.view.runtime.pop(a.fragment.id, None)
        for pipeline in {a.fragment.pipeline for a in moving}:
            record = self.view.pipelines.get(pipeline)
            if record is not None and record.state in ACTIVE:
                await self._set_state(record, PipelineState.FAILING, reason)
        await self._schedule(exclude=[node])

    def _stranded_at_own_site(self, a: Assignment, node: str) -> bool:
        site_name = a.fragment.site
        if a.fragment.kind != "local" or site_name is None:
            return False
        site = self.topology().site(site_name)
        if site is None or not site.nats_url:
            return False
        return not any(
            n.state == NodeState.ALIVE and n.spec.site == site_name and n.name != node
            for n in self.view.nodes.values()
        )

    # -- re-planning --------------------------------------------------------------------
    def _cost(self, fragment: Fragment, node: str) -> float | None:
        """What a placement costs in the planner's terms: a local fragment's distance
        from its own site, a global fragment's worst latency to its input sites."""
        topology = self.topology()
        record = self.view.nodes.get(node)
        if record is None:
            return None
        site = record.spec.site
        if fragment.kind == "local" and fragment.site is not None:
            return topology.latency(fragment.site, site)
        values = [topology.latency(site, s) for s in fragment.input_sites]
        if any(v is None for v in values):
            return None
        return max((v for v in values if v is not None), default=0.0)

    def _unsettled(self, node: str) -> None:
        self.view.alive_since[node] = time.monotonic()
        self.view.unsettled.add(node)

    def _settling(self) -> list[str]:
        limit = time.monotonic() - self.settings.settle_seconds
        return [n for n in self.view.unsettled if self.view.alive_since.get(n, 0) > limit]

    async def _rebalance_settled(self) -> None:
        """Re-plan once a node that joined or recovered has stayed alive long enough."""
        settling = set(self._settling())
        settled = sorted(self.view.unsettled - settling)
        if not settled:
            return
        self.view.unsettled -= set(settled)
        live = [n for n in settled if self.view.nodes.get(n, None) is not None]
        if live:
            await self._rebalance(f"node {', '.join(live)} joined")

    async def _rebalance(self, reason: str) -> None:
        """After a topology change, re-plan running fragments one at a time and move the
        ones whose new place is better by the margin. A move stops the fragment at a
        committed batch (a savepoint), then starts it on the new node from there, so
        its state and exactly-once output survive the move."""
        view = self._cluster_view()
        margin = self.settings.replan_margin
        for record in sorted(self.view.pipelines.values(), key=lambda r: -r.priority):
            if record.state != PipelineState.RUNNING or not record.fragments:
                continue
            for a in self._assignments_of(record.name):
                if a.action != "run" or a.move_to:
                    continue
                current = self._cost(a.fragment, a.node)
                view.used_slots[a.node] = view.used_slots.get(a.node, 1) - 1
                try:
                    plan = place(
                        [a.fragment],
                        view,
                        priority=record.priority,
                        latency_budget=record.latency_budget,
                        trigger=record.spec.trigger,
                        hops=hops_of(record.fragments),
                        exclude=[n for n in self._settling() if n != a.node],
                    )
                except PlacementError:
                    view.used_slots[a.node] = view.used_slots.get(a.node, 0) + 1
                    continue
                target = plan.placement[a.fragment.id]
                better = self._cost(a.fragment, target)
                gain = (current if current is not None else float("inf")) - (better or 0.0)
                if (
                    target == a.node
                    or better is None
                    or gain <= max(0.001, margin * (current or 0))
                ):
                    view.used_slots[target] = view.used_slots.get(target, 1) - 1
                    view.used_slots[a.node] = view.used_slots.get(a.node, 0) + 1
                    continue
                await self._start_move(a, target, f"{reason}: {plan.decisions[0].why}")

    async def _start_move(self, a: Assignment, target: str, reason: str) -> None:
        savepoint = str(
            Path(self.settings.savepoint_root)
            / "moves"
            / a.fragment.pipeline
            / f"{a.fragment.id}-e{a.epoch}"
        )
        moving = a.model_copy(
            update={
                "action": "savepoint",
                "savepoint_dir": savepoint,
                "move_to": target,
                "reason": f"moving to {target} ({reason})",
            }
        )
        await self._commit(
            "move-start",
            {"fragment": a.fragment.id, "from": a.node, "to": target, "reason": reason},
            [put(ASSIGNMENTS_BUCKET, moving.key, moving)],
        )
        self.view.assignments[a.fragment.id] = moving
        log.info("moving %s from %s to %s: %s", a.fragment.id, a.node, target, reason)

    async def _finish_move(self, a: Assignment) -> None:
        """The fragment stopped at a savepoint on its old node: start it on the new one."""
        assert a.move_to is not None
        record = self.view.pipelines.get(a.fragment.pipeline)
        if record is None:
            return
        epochs = dict(record.epochs)
        epochs[a.fragment.id] = max(epochs.get(a.fragment.id, 0), a.epoch) + 1
        moved = Assignment(
            fragment=a.fragment,
            node=a.move_to,
            epoch=epochs[a.fragment.id],
            checkpoint_dir=a.checkpoint_dir,
            restore_from=a.savepoint_dir,
            reason=f"moved from {a.node}",
        )
        updated = record.model_copy(update={"epochs": epochs})
        await self._commit(
            "move-done",
            {"fragment": a.fragment.id, "from": a.node, "to": a.move_to, "epoch": moved.epoch},
            [
                delete(ASSIGNMENTS_BUCKET, a.key),
                put(ASSIGNMENTS_BUCKET, moved.key, moved),
                put(PIPELINES_BUCKET, record.name, updated),
            ],
        )
        self.view.assignments[a.fragment.id] = moved
        self.view.runtime.pop(a.fragment.id, None)
        self.view.pipelines[record.name] = updated

    # -- what nodes tell us -------------------------------------------------------------
    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            hb = Heartbeat.model_validate_json(msg.data)
        except ValidationError as exc:
            log.warning("bad heartbeat on %s: %s", msg.subject, exc)
            return
        record = self.view.nodes.get(hb.node)
        if record is None or (record.agent_id and hb.agent_id != record.agent_id):
            return  # unknown node, or a stale agent that was replaced
        self.view.last_seen[hb.node] = time.monotonic()
        self.view.heartbeats[hb.node] = hb
        changed = False
        for frag_id, rt in hb.fragments.items():
            a = self.view.assignments.get(frag_id)
            if a is not None and a.node == hb.node and a.epoch == rt.epoch:
                old = self.view.runtime.get(frag_id)
                changed |= old is None or (old.status, old.epoch) != (rt.status, rt.epoch)
                self.view.runtime[frag_id] = rt
        if record.state != NodeState.FAILED and not changed:
            return  # the common case: progress only, no decision to take
        async with self._lock:
            record = self.view.nodes.get(hb.node, record)
            if record.state == NodeState.FAILED:
                await self._set_node_state(record, NodeState.ALIVE, "node-recovered")
                self._unsettled(hb.node)
                await self._schedule()
            await self._refresh_states()

    async def _on_activity(self, msg: Msg) -> None:
        try:
            act = Activity.model_validate_json(msg.data)
        except ValidationError as exc:
            log.warning("bad activity report on %s: %s", msg.subject, exc)
            return
        rt = act.runtime
        async with self._lock:
            a = self.view.assignments.get(rt.fragment_id)
            if a is None or a.node != act.node or a.epoch != rt.epoch:
                return  # about a placement that is no longer current
            self.view.runtime[rt.fragment_id] = rt
            record = self.view.pipelines.get(a.fragment.pipeline)
            if record is None:
                return
            if act.event == "savepointed" and a.move_to:
                if act.savepoint_dir == a.savepoint_dir:
                    await self._finish_move(a)
            elif act.event == "failed":
                await self._end(
                    record,
                    PipelineState.FAILED,
                    f"fragment {rt.fragment_id} on {act.node}: {rt.error}",
                )
            elif act.event == "savepointed" and record.state == PipelineState.STOPPING:
                if self._savepoint_complete(record.name):
                    await self._end(record, PipelineState.STOPPED, f"savepoint {record.savepoint}")
            else:
                await self._refresh_states()

    async def _refresh_states(self) -> None:
        """RUNNING when every fragment runs; FAILING while any is failing or unplaced."""
        for record in list(self.view.pipelines.values()):
            if record.state not in (
                PipelineState.PLANNED,
                PipelineState.RUNNING,
                PipelineState.FAILING,
            ):
                continue
            fragments = self._fragments(record)
            statuses = []
            unreachable = []
            for f in fragments:
                a = self.view.assignments.get(f.id)
                rt = self.view.runtime.get(f.id)
                node = self.view.nodes.get(a.node) if a else None
                if a is not None and node is not None and node.state == NodeState.FAILED:
                    unreachable.append(f"{f.id} on {a.node}")
                statuses.append(
                    None if a is None else (rt.status if rt and rt.epoch == a.epoch else "starting")
                )
            if any(s is None for s in statuses):
                continue  # _schedule reports why
            if unreachable:
                await self._set_state(
                    record,
                    PipelineState.FAILING,
                    f"unreachable: {', '.join(unreachable)} (cut off? a site with its own "
                    "server keeps processing and catches up when it returns)",
                )
            elif all(s == "running" for s in statuses):
                await self._set_state(record, PipelineState.RUNNING, "all fragments running")
            elif any(s == "failing" for s in statuses):
                errors = [
                    self.view.runtime[f.id].error for f in fragments if f.id in self.view.runtime
                ]
                await self._set_state(
                    record,
                    PipelineState.FAILING,
                    "; ".join(e for e in errors if e) or "a fragment is failing",
                )
            elif all(s == "finished" for s in statuses):
                await self._end(record, PipelineState.FINISHED, "every query finished")

    async def _monitor(self) -> None:
        """Mark silent nodes failed and re-place their fragments; retry waiting pipelines."""
        interval = self.settings.heartbeat_interval
        limit = interval * self.settings.failure_after
        while True:
            await asyncio.sleep(interval / 2)
            try:
                async with self._lock:
                    clock = time.monotonic()
                    for name, record in list(self.view.nodes.items()):
                        if record.state not in (NodeState.ALIVE, NodeState.DRAINING):
                            continue
                        silent = clock - self.view.last_seen.get(name, clock)
                        if silent > limit:
                            await self._set_node_state(
                                record, NodeState.FAILED, "node-failed", silent_s=round(silent, 1)
                            )
                            log.warning(
                                "node %s missed heartbeats for %.1f s: failed", name, silent
                            )
                            await self._move_fragments_off(
                                name, reason=f"node {name} failed", failed=True
                            )
                            await self._refresh_states()
                    await self._schedule()
                    await self._rebalance_settled()
            except Exception:
                log.exception("monitor pass failed")

    # -- observation -------------------------------------------------------------------
    def pipeline_status(self, name: str) -> dict[str, Any]:
        record = self.pipeline(name)
        shown = self._shown_fragments(record)
        topology = self.topology()
        fragments = []
        path = 0.0
        for f in shown:
            a = self.view.assignments.get(f.id)
            rt = self.view.runtime.get(f.id)
            node = self.view.nodes.get(a.node) if a else None
            worst = (
                max((topology.latency(node.spec.site, s) or 0.0 for s in f.input_sites), default=0)
                if node is not None
                else 0.0
            )
            path = max(path, worst)
            fragments.append(
                {
                    "id": f.id,
                    "kind": f.kind,
                    "site": node.spec.site if node else f.site,
                    "input_sites": list(f.input_sites),
                    "steps": list(f.steps),
                    "node": a.node if a else None,
                    "epoch": a.epoch if a else record.epochs.get(f.id, 0),
                    "action": a.action if a else None,
                    "status": (
                        rt.status
                        if rt and a and rt.epoch == a.epoch
                        else ("starting" if a else "unassigned")
                    ),
                    "input_latency_s": round(worst, 4),
                    "runtime": rt.model_dump() if rt else None,
                }
            )
        batch_ms = [
            rt.last_batch_ms for f in shown if (rt := self.view.runtime.get(f.id)) is not None
        ]
        # Every fragment on the path waits up to a trigger interval and runs one batch;
        # the network adds the worst one-way latency into a global fragment.
        hops = hops_of(shown) if shown else 1
        estimate = path + hops * (record.spec.trigger + max(batch_ms) / 1000) if batch_ms else None
        return {
            "name": name,
            "state": record.state.value,
            "reason": record.reason,
            "latency_estimate_s": round(estimate, 3) if estimate is not None else None,
            "over_latency_budget": (
                estimate > record.latency_budget
                if estimate is not None and record.latency_budget
                else None
            ),
            "priority": record.priority,
            "latency_budget": record.latency_budget,
            "parallelism": record.parallelism,
            "run_id": record.run_id,
            "submitted_at": record.submitted_at,
            "savepoint": record.savepoint,
            "fragments": fragments,
            "history": [h.model_dump() for h in record.history],
        }

    def pipeline_metrics(self, name: str) -> dict[str, Any]:
        record = self.pipeline(name)
        rts = [
            self.view.runtime[f.id]
            for f in self._shown_fragments(record)
            if f.id in self.view.runtime
        ]
        return {
            "name": name,
            "state": record.state.value,
            "batches": sum(r.batches for r in rts),
            "rows_in": sum(r.rows_in for r in rts),
            "input_rows_per_s": sum(r.input_rows_per_s for r in rts),
            "processed_rows_per_s": sum(r.processed_rows_per_s for r in rts),
            "lag": sum(r.lag for r in rts),
            "dead_letters": sum(r.dead_letters for r in rts),
            "restarts": sum(r.restarts for r in rts),
            "last_batch_ms": max((r.last_batch_ms for r in rts), default=0),
            "fragments": {r.fragment_id: r.model_dump() for r in rts},
        }

    def node_status(self, name: str) -> dict[str, Any]:
        record = self.node(name)
        hb = self.view.heartbeats.get(name)
        seen = self.view.last_seen.get(name)
        return {
            **record.model_dump(mode="json"),
            "name": name,
            "fragments": sorted(
                a.fragment.id for a in self.view.assignments.values() if a.node == name
            ),
            "running": sorted(hb.fragments) if hb else [],
            "agent_fragments": {k: v.model_dump() for k, v in hb.fragments.items()} if hb else {},
            "slots": record.spec.capabilities.fragment_slots,
            "cpu_percent": hb.cpu_percent if hb else None,
            "memory_percent": hb.memory_percent if hb else None,
            "last_heartbeat_s": round(time.monotonic() - seen, 2) if seen is not None else None,
            "streams": [u.model_dump() for u in hb.streams] if hb else [],
            "warnings": [u.warning for u in hb.streams if u.warning] if hb else [],
            "last_known_assignments": hb.last_known if hb else False,
        }

    def cluster_metrics(self) -> dict[str, Any]:
        nodes = self.view.nodes.values()
        by_state: dict[str, int] = {s.value: 0 for s in NodeState}
        for n in nodes:
            by_state[n.state.value] += 1
        live = [n for n in nodes if n.state in (NodeState.ALIVE, NodeState.DRAINING)]
        slots = sum(n.spec.capabilities.fragment_slots for n in live)
        cores = sum(n.spec.capabilities.cores for n in live)
        used = len(self.view.assignments)
        cpus = [
            self.view.heartbeats[n.name].cpu_percent for n in live if n.name in self.view.heartbeats
        ]
        pipelines: dict[str, int] = {s.value: 0 for s in PipelineState}
        for p in self.view.pipelines.values():
            pipelines[p.state.value] += 1
        return {
            "nodes": by_state,
            "cores": cores,
            "slots": slots,
            "slots_used": used,
            "utilisation": round(used / slots, 3) if slots else 0.0,
            "cpu_percent": round(sum(cpus) / len(cpus), 1) if cpus else 0.0,
            "throughput_rows_per_s": round(
                sum(r.input_rows_per_s for r in self.view.runtime.values()), 1
            ),
            "pipelines": pipelines,
            "uptime_s": round(time.time() - self.started_at, 1),
        }
