"""The coordinator: a thin service shell around the control rooms.

It owns the I/O: the NATS connection, the control log (:mod:`spanflow.control.log`),
the subscriptions to heartbeats and activity reports, and the timer that checks for
silent nodes. Every request or event becomes a :class:`~spanflow.control.state.Draft`;
the rooms (registry, pipelines, scheduler, topology manager, reconciler) add records
to it without I/O; the shell commits the records — appended to the log, applied to the
state, projected to the KV buckets agents watch — or, when a room refuses, commits
nothing. Agents never ask the coordinator what to run: they watch their keys, so a
coordinator can die and come back (from nothing but NATS) without any fragment
noticing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext

from spanflow.clock import Clock, SystemClock
from spanflow.control import (
    leadership,
    pipelines,
    rebalancer,
    reconciler,
    records,
    registry,
    scheduler,
    topology_manager,
)
from spanflow.control.errors import NotLeader, Unavailable
from spanflow.control.leadership import Lease
from spanflow.control.lease_bucket import LeaseBucket
from spanflow.control.log import ControlLog
from spanflow.control.models import with_model_needs
from spanflow.control.node_reports import NodeReports
from spanflow.control.observation import ClusterView
from spanflow.control.requests import Registration, Submission
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed
from spanflow.nats.cluster import (
    ACTIVITY_PREFIX,
    HEARTBEAT_PREFIX,
    cluster_servers,
)
from spanflow.nats.streams import connect
from spanflow.plan import Placer
from spanflow.plan.planner import GeoPlacer
from spanflow.protocol.messages import ScaleReport, ShedRequest
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.protocol.rest import (
    ShedAnswer,
)
from spanflow.security.environment import assignment_signer, control_identity_from_env
from spanflow.security.node_seal import ReportGate
from spanflow.spec import locations
from spanflow.spec.cluster import Assignment, NodeRecord, PipelineRecord
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.topology import Capabilities, Link, NodeSpec, Site, Topology
from spanflow.spec.upgrade import UpgradeReport

__all__ = ["Coordinator", "CoordinatorSettings", "Registration", "Submission"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_NO_ANSWER = (TimeoutError, NatsError)
"""What a NATS call raises while the servers elect or reconnect (no answer, or
'no responders'): worth waiting out, unlike a refusal."""
STARTUP_PATIENCE = 60.0
"""Seconds a starting replica retries opening the control plane before it gives up."""
STOP_PATIENCE = 10.0
"""Seconds a stopping coordinator waits for its loops, and then for each NATS drain."""


class Coordinator:
    def __init__(
        self,
        settings: CoordinatorSettings,
        placer: Placer | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.placer: Placer = placer or GeoPlacer()
        self.clock: Clock = clock or SystemClock()
        self.state = ClusterState()
        self.observed = Observed()
        self.nc: Client | None = None
        """The data plane: agents' heartbeats and reports, the KV the agents read."""
        self.control_nc: Client | None = None
        """The control log, snapshots and lease (locked: the control account; open:
        the same connection as ``nc``)."""
        self.control_log: ControlLog | None = None
        self.started_at = self.clock.monotonic()
        self._next_rebalance = self.started_at + self.settings.rebalance_interval
        self._followed: dict[str, str] = {}
        """Pipeline → what following the sites last did (logged when it changes)."""
        self.recovered_records = 0
        self._leases: LeaseBucket | None = None
        self.reports = ReportGate(settings.node_token_key)
        """Which node reports count (locked: those sealed by their own node)."""
        self.lease_seconds = settings.lease_seconds or leadership.SINGLE_SERVER_LEASE
        """How long a lease lasts: the lease bucket's TTL (see leadership.lease_for)."""
        self._renewed_at = float("-inf")
        self.leading = False
        self.leader_url: str | None = None
        self._merged_topology = False
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.node_reports = NodeReports(self)
        """Heartbeats and activity reports: sealed by their node, then decided on."""
        self.view = ClusterView(self)
        """Every read the REST API answers (control/observation.py)."""

    # -- start-up -------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.nc = await connect(
            s.nats_url, name=f"spanflow-{s.name}", reconnected_cb=self._reconnected
        )
        control = control_identity_from_env()
        self.control_nc = self.nc
        if control is not None:
            self.control_nc = await connect(
                s.nats_url, identity=control, name=f"spanflow-{s.name}-control"
            )
        await self._open_control_plane()
        await self.nc.subscribe(f"{HEARTBEAT_PREFIX}.*", cb=self.node_reports.on_heartbeat)
        await self.nc.subscribe(f"{ACTIVITY_PREFIX}.>", cb=self.node_reports.on_activity)
        with contextlib.suppress(*_NO_ANSWER):
            await self._campaign()  # a lone replica leads from here on
        self._tasks.append(asyncio.create_task(self._leadership(), name="spanflow-lease"))
        self._tasks.append(asyncio.create_task(self._monitor(), name="spanflow-monitor"))
        log.info(
            "coordinator %s up as %s: %d nodes, %d pipelines, %d assignments "
            "(%d log records replayed)",
            s.name,
            self.role,
            len(self.state.nodes),
            len(self.state.pipelines),
            len(self.state.assignments),
            self.recovered_records,
        )

    async def _open_control_plane(self) -> None:
        """The log, the lease bucket and the state, retried with back-off: replicas
        started at the same instant race to create the same streams, and a bucket just
        created on a cluster answers only once its Raft group has a leader."""
        assert self.nc is not None and self.control_nc is not None
        s, js = self.settings, self.control_nc.jetstream()
        wait, deadline = 0.2, self.clock.monotonic() + STARTUP_PATIENCE
        while True:
            try:
                self.control_log = await ControlLog.open(
                    self.control_nc, s.replicas, data_nc=self.nc, signer=assignment_signer()
                )
                wanted = s.lease_seconds or leadership.lease_for(cluster_servers(self.nc))
                mine = Lease(holder=s.name, url=s.url)
                self._leases = await LeaseBucket.open(js, mine, wanted, s.replicas)
                self.lease_seconds = self._leases.seconds
                self.state, self.recovered_records = await self.control_log.recover()
                return
            except _NO_ANSWER as exc:
                if self.clock.monotonic() + wait > deadline:
                    raise Unavailable(
                        "control_plane_unavailable",
                        f"the control plane's streams did not answer within "
                        f"{STARTUP_PATIENCE:.0f} s: {exc!r}",
                    ) from None
                log.info("control plane not ready (%r); again in %.1f s", exc, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, 5.0)

    @property
    def role(self) -> Literal["leader", "standby"]:
        return "leader" if self.leading else "standby"

    async def stop(self) -> None:
        """Stop the loops and drain NATS, each within :data:`STOP_PATIENCE` seconds: a
        stop never hangs on a call that does not answer."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_PATIENCE)
        for nc in {id(c): c for c in (self.control_nc, self.nc) if c is not None}.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.drain(), STOP_PATIENCE)
            if not nc.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), STOP_PATIENCE)

    # -- leadership -----------------------------------------------------------------------
    async def _leadership(self) -> None:
        """Renew the lease (leader) or watch for it to lapse and tail the log (standby)."""
        answered = True
        while True:
            period = self.lease_seconds / leadership.RENEWALS_PER_LEASE
            await asyncio.sleep(period if answered or not self.leading else leadership.LEASE_RETRY)
            try:
                answered = await self._campaign()
            except Exception:
                log.exception("leadership pass failed")
                answered = True

    async def _campaign(self) -> bool:
        """One round: hold or get the lease if we can; take office or step down. False
        when the lease bucket did not answer and a leader keeps office meanwhile (the
        caller retries soon: the lease is running out)."""
        s, leases = self.settings, self._leases
        assert leases is not None, "start() first"
        asked_at = self.clock.monotonic()
        try:
            lease = await leases.read()
            held = await leases.hold(leadership.next_step(s.name, lease), lease)
        except _NO_ANSWER as exc:  # NATS electing: the lease is neither ours nor lost
            if self.leading and leadership.keeps_office(
                self._renewed_at, self.clock.monotonic(), self.lease_seconds
            ):
                log.info("lease renewal got no answer (%r); still leading", exc)
                return False
            lease, held = None, False
        if held:
            self._renewed_at = asked_at
        if not held and lease is not None and lease.holder != s.name:
            self.leader_url = lease.url
        if held and not self.leading:
            await self._take_office()
        elif not held and self.leading:
            self._step_down(f"lease held by {lease.holder if lease else 'nobody'}")
        if not self.leading:
            async with self._lock:
                await self._follow()
        else:
            assert self.control_log is not None
            async with self._lock:
                await self.control_log.repair_if_needed(self.state)
        return True

    async def _follow(self) -> None:
        assert self.control_log is not None
        if await self.control_log.follow(self.state):
            self.observed.prune(self.state)

    async def _take_office(self) -> None:
        assert self.control_log is not None
        s = self.settings
        async with self._lock:
            await self._follow()
            tx = leadership.take_office(self.state, s.name, self.clock.time())
            if s.topology is not None and not self._merged_topology:
                registry.merge_topology(tx, s.topology)
            try:
                await self.control_log.commit(self.state, tx.records)
            except Unavailable as exc:
                log.warning("could not take office: %s", exc)
                return
            self._merged_topology = True
            self.leading = True
            self.control_log.guard(leading=True)
            self.leader_url = s.url
            topology_manager.grace(self.state, self.observed, self.clock.monotonic())
        log.info("%s leads (epoch %d)", s.name, self.state.leader_epoch)
        reports = await self.node_reports.savepointed()

        def catch_up(tx: Draft) -> None:
            reconciler.catch_up_savepoints(tx, self.observed, reports, self.settings)
            self.schedule(tx)

        await self.decide(catch_up)

    def _step_down(self, why: str) -> None:
        log.warning("%s steps down: %s", self.settings.name, why)
        self.leading = False
        if self.control_log is not None:
            self.control_log.guard(leading=False)

    # -- the one way state changes --------------------------------------------------------
    async def decide(self, decide: Callable[[Draft], T]) -> T:
        """Run a room's decision on a draft and commit its records (all or none)."""
        assert self.control_log is not None
        async with self._lock:
            if not self.leading:
                raise NotLeader(self.state.leader, self.leader_url)
            tx = Draft(self.state, self.clock.time(), epoch=self.state.leader_epoch)
            result = decide(tx)
            await self._commit(tx)
            return result

    async def _commit(self, tx: Draft) -> None:
        assert self.control_log is not None
        try:
            await self.control_log.commit(self.state, tx.records)
        except Unavailable as exc:  # another replica wrote: we are not the leader
            self._step_down(str(exc))
            raise
        self.observed.prune(self.state)

    def jetstream(self) -> JetStreamContext:
        """The JetStream context of the coordinator's connection, for the stores of
        models and rule sets (Unavailable, a 503, before it is connected)."""
        if self.nc is None:
            raise Unavailable("not_connected", "the coordinator is not connected to NATS yet")
        return self.nc.jetstream()

    async def change_catalog(
        self, write: Callable[[], Awaitable[T]], change: Callable[[T], dict[str, Any]]
    ) -> T:
        """A change of the model registry or the rule sets, which keep their files and
        manifests in stores of their own: written by the leader only (a standby raises
        NotLeader, which the API answers with a redirect to the leader, as for every
        write), under the lock decisions take, then recorded in the control log
        (``change(result)``: the fields of its CatalogChanged record)."""
        async with self._lock:
            if not self.leading:
                raise NotLeader(self.state.leader, self.leader_url)
            result = await write()
            tx = Draft(self.state, self.clock.time(), epoch=self.state.leader_epoch)
            tx.add(records.CatalogChanged, **change(result))
            await self._commit(tx)
            return result

    def _tell_new(self, followed: dict[str, str]) -> None:
        """Log what following the sites did, once per pipeline and outcome (the
        monitor pass asks every second)."""
        for name, outcome in followed.items():
            if self._followed.get(name) != outcome:
                log.info("pipeline %s: %s", name, outcome)
        self._followed = dict(followed)

    def schedule(self, tx: Draft, exclude: list[str] | None = None) -> None:
        scheduler.schedule(tx, self.placer, self.settings, self.observed, exclude or ())

    def _move_off(self, tx: Draft, node: str, reason: str) -> None:
        scheduler.move_fragments_off(
            tx,
            node,
            reason=reason,
            placer=self.placer,
            settings=self.settings,
            observed=self.observed,
        )

    def _rebalance(self, tx: Draft, reason: str) -> None:
        scheduler.rebalance(tx, self.observed, self.settings, self.clock.monotonic(), reason)

    # -- nodes and topology ---------------------------------------------------------------
    async def register_node(self, reg: Registration) -> NodeRecord:
        def decide(tx: Draft) -> NodeRecord:
            record = registry.register(tx, reg)
            self.schedule(tx)
            return record

        before = self.state.nodes.get(reg.name)
        replaced = before is not None and before.agent_id not in (None, reg.agent_id)
        record = await self.decide(decide)
        self.observed.heartbeats.pop(reg.name, None)  # its predecessor's, if it restarted
        if replaced:  # what its predecessor reported is no longer what runs there
            self.observed.forget_runtimes(self.state, reg.name)
        self.observed.joined(reg.name, self.clock.monotonic())
        return record

    async def drain_node(self, name: str) -> NodeRecord:
        """Move a node's fragments away and give it no new ones (until it re-registers)."""

        def decide(tx: Draft) -> None:
            if registry.drain(tx, name):
                self._move_off(tx, name, f"node {name} drained")

        await self.decide(decide)
        return self.view.node(name)

    async def remove_node(self, name: str) -> None:
        def decide(tx: Draft) -> None:
            registry.node(tx.state, name)
            self._move_off(tx, name, f"node {name} left")
            registry.remove(tx, name)

        await self.decide(decide)
        self.observed.forget(name)

    async def shed(self, node: str, request: ShedRequest) -> ShedAnswer:
        """An overloaded node asks for one of its fragments to move to a peer."""

        def decide(tx: Draft) -> Assignment:
            return rebalancer.shed(tx, node, request, self.observed, self.settings)

        a = await self.decide(decide)
        moving = self.state.assignments[a.fragment.id]
        return ShedAnswer.model_validate(
            {"fragment": a.fragment.id, "from": node, "to": moving.move_to, "epoch": a.epoch}
        )

    async def node_scaled(self, name: str, report: ScaleReport) -> NodeRecord:
        """A node on a Spark cluster changed its executor allocation: the control log
        (and the dashboard's control events) say so, with the pressure that made it."""
        await self.decide(lambda tx: registry.scaled(tx, name, report))
        return self.view.node(name)

    async def update_capabilities(self, name: str, caps: Capabilities) -> NodeRecord:
        def decide(tx: Draft) -> None:
            registry.update_capabilities(tx, name, caps)
            self.schedule(tx)
            self._rebalance(tx, f"capabilities of {name} changed")

        await self.decide(decide)
        return self.view.node(name)

    async def put_site(self, site: Site) -> Topology:
        return await self._change_topology(
            lambda tx: registry.put_site(tx, site), f"site {site.name} changed"
        )

    async def put_node(self, spec: NodeSpec) -> Topology:
        return await self._change_topology(
            lambda tx: registry.put_node(tx, spec), f"node {spec.name} declared"
        )

    async def put_link(self, link: Link) -> Topology:
        return await self._change_topology(
            lambda tx: registry.put_link(tx, link), f"link {'-'.join(link.between)} changed"
        )

    async def _change_topology(self, change: Callable[[Draft], None], reason: str) -> Topology:
        """A change of sites or links, then the fragments it affects moved."""

        def decide(tx: Draft) -> None:
            change(tx)
            self._rebalance(tx, reason)

        await self.decide(decide)
        return self.view.topology()

    # -- pipelines ------------------------------------------------------------------------
    async def submit(self, sub: Submission) -> PipelineRecord:
        pinned = sub.model_copy(update={"spec": await with_model_needs(self.nc, sub.spec)})
        run_id = uuid.uuid4().hex[:8]

        def decide(tx: Draft) -> None:
            pipelines.submit(tx, pinned, run_id)
            self.schedule(tx)

        await self.decide(decide)
        return self.view.pipeline(sub.spec.name)

    async def cancel(self, name: str) -> PipelineRecord:
        await self.decide(lambda tx: pipelines.cancel(tx, name))
        return self.view.pipeline(name)

    async def savepoint(self, name: str) -> PipelineRecord:
        """Stop every fragment at a consistent checkpoint and keep a copy of it."""
        root = self.settings.savepoint_root
        await self.decide(lambda tx: pipelines.savepoint(tx, name, root))
        return self.view.pipeline(name)

    async def upgrade(self, spec: PipelineSpec) -> UpgradeReport:
        """Replace a running pipeline by a new version that keeps its state
        (:func:`spanflow.control.pipelines.upgrade`): refused with the reason per step,
        nothing stopped, when the state cannot be kept."""
        pinned = await with_model_needs(self.nc, spec)
        root = self.settings.savepoint_root
        reports: list[UpgradeReport] = []
        await self.decide(lambda tx: reports.append(pipelines.upgrade(tx, pinned, root)))
        return reports[-1]

    async def resume(self, name: str, savepoint: str | None = None) -> PipelineRecord:
        source = savepoint or self.view.pipeline(name).savepoint
        exists = source is not None and (locations.is_url(source) or Path(source).is_dir())

        def decide(tx: Draft) -> None:
            pipelines.resume(tx, name, source, exists)
            self.schedule(tx)

        await self.decide(decide)
        return self.view.pipeline(name)

    async def rebaseline(
        self,
        name: str,
        step: str | None,
        key: str | None,
        record: Mapping[str, Any] | None = None,
        by: str = "",
    ) -> records.DetectorRebaselined:
        """Accept a key's behaviour as normal in a detector (spanflow.ml.rebaseline)."""
        return await self.decide(lambda tx: pipelines.rebaseline(tx, name, step, key, record, by))

    # -- what nodes tell us (control/node_reports.py) -------------------------------------
    async def _reconnected(self) -> None:
        """Back on NATS after a disconnection: we, not the nodes, were silent; give
        every live node a full period to be heard again."""
        log.warning("reconnected to NATS at %s", self.nc.connected_url if self.nc else "?")
        topology_manager.grace(self.state, self.observed, self.clock.monotonic(), reset=True)

    async def _monitor(self) -> None:
        """Mark silent nodes failed and re-place their fragments; retry waiting
        pipelines; re-plan once joined nodes have settled."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval / 2)
            if not self.leading:
                continue
            try:
                settled = await self.decide(self._check)
                self.observed.unsettled -= set(settled)
            except Exception:
                log.exception("monitor pass failed")
            try:  # a decision of its own: a failure here never stops failure detection
                self._tell_new(await self.decide(self._follow_sites))
            except Exception:
                log.exception("following the sites failed")

    def _follow_sites(self, tx: Draft) -> dict[str, str]:
        def runtime_of(fragment_id: str) -> FragmentRuntime | None:
            """The latest report of the fragment's current assignment."""
            a = self.state.assignments.get(fragment_id)
            return self.observed.current(a) if a is not None else None

        return pipelines.follow_sites(tx, self.settings.savepoint_root, runtime_of)

    def _check(self, tx: Draft) -> list[str]:
        now = self.clock.monotonic()
        for name, reason in topology_manager.failures(tx.state, self.observed, self.settings, now):
            topology_manager.fail(
                tx,
                name,
                reason,
                placer=self.placer,
                settings=self.settings,
                observed=self.observed,
            )
            reconciler.refresh_states(tx, self.observed)
        self.schedule(tx)
        if self.settings.rebalance and now >= self._next_rebalance:
            self._next_rebalance = now + self.settings.rebalance_interval
            rebalancer.rebalance(tx, self.observed, self.settings, now)
        return scheduler.rebalance_settled(tx, self.observed, self.settings, now)
