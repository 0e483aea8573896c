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
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError

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
    views,
)
from spanflow.control.errors import NotLeader, Unavailable
from spanflow.control.leadership import LEASE_KEY, Lease
from spanflow.control.log import ControlLog
from spanflow.control.models import with_model_needs
from spanflow.control.requests import Registration, Submission
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed
from spanflow.nats.cluster import (
    ACTIVITY_PREFIX,
    ACTIVITY_STREAM,
    HEARTBEAT_PREFIX,
    LEADER_BUCKET,
    activity_subject,
    cluster_servers,
    ensure_kv,
)
from spanflow.nats.streams import connect
from spanflow.plan import Placer
from spanflow.plan.planner import GeoPlacer
from spanflow.protocol.messages import Activity, Heartbeat, ScaleReport, ShedRequest
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
    ShedAnswer,
)
from spanflow.security.environment import assignment_signer, control_identity_from_env
from spanflow.security.node_seal import SEAL_HEADER, ReportGate
from spanflow.spec import locations
from spanflow.spec.cluster import Assignment, NodeRecord, PipelineRecord, PipelineState
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
        self._leases: KeyValue | None = None
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
        self._pending: set[asyncio.Task[None]] = set()

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
        await self.nc.subscribe(f"{HEARTBEAT_PREFIX}.*", cb=self._on_heartbeat)
        await self.nc.subscribe(f"{ACTIVITY_PREFIX}.>", cb=self._on_activity)
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
                self._leases = await ensure_kv(js, LEADER_BUCKET, ttl=wanted, replicas=s.replicas)
                self.lease_seconds = await self._bucket_lease(wanted)
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

    async def _bucket_lease(self, wanted: float) -> float:
        """The lease every replica times itself by: the lease bucket's own TTL (set by
        whoever created it), so replicas configured differently never disagree."""
        assert self.control_nc is not None
        info = await self.control_nc.jetstream().stream_info(f"KV_{LEADER_BUCKET}")
        actual = float(info.config.max_age or 0) or wanted
        if actual != wanted:
            log.warning(
                "lease bucket times leases at %.1f s (not %.1f s): using it", actual, wanted
            )
        return actual

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

    async def _savepoint_reports(self) -> list[Activity]:
        """The last 'savepointed' report of every assignment taking a savepoint: it may
        have completed while no coordinator was listening."""
        assert self.nc is not None
        js = self.nc.jetstream()
        out = []
        for a in list(self.state.assignments.values()):
            if a.action != "savepoint":
                continue
            subject = activity_subject(a.node, a.fragment.id, "savepointed")
            try:
                msg = await js.get_last_msg(ACTIVITY_STREAM, subject)
                act = Activity.model_validate_json(msg.data or b"")
            except (NotFoundError, ValidationError):
                continue
            sealed = (msg.headers or {}).get(SEAL_HEADER)
            # A stored report: its age is no sign of a replay (now = its own time).
            if self.reports.refusal(a.node, subject, msg.data or b"", sealed, act.at, act.at):
                continue
            out.append(act)
        return out

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

    @property
    def leases(self) -> KeyValue:
        assert self._leases is not None, "start() first"
        return self._leases

    async def _read_lease(self) -> Lease | None:
        try:
            entry = await asyncio.wait_for(
                self.leases.get(LEASE_KEY), leadership.LEASE_CALL_TIMEOUT
            )
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        return Lease.model_validate_json(entry.value).model_copy(
            update={"revision": entry.revision or 0}
        )

    async def _campaign(self) -> bool:
        """One round: hold or get the lease if we can; take office or step down. False
        when the lease bucket did not answer and a leader keeps office meanwhile (the
        caller retries soon: the lease is running out)."""
        s = self.settings
        asked_at = self.clock.monotonic()
        try:
            lease = await self._read_lease()
            held = await self._hold(leadership.next_step(s.name, lease), lease)
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

    async def _hold(self, step: leadership.Step, lease: Lease | None) -> bool:
        """Create or renew the lease as ``step`` says; False when another replica
        holds it (the create or compare-and-set is refused)."""
        mine = Lease(holder=self.settings.name, url=self.settings.url)
        try:
            if step == leadership.Step.CAMPAIGN:
                await asyncio.wait_for(
                    self.leases.create(LEASE_KEY, mine.value()), leadership.LEASE_CALL_TIMEOUT
                )
                return True
            if step == leadership.Step.RENEW:
                assert lease is not None
                await asyncio.wait_for(
                    self.leases.update(LEASE_KEY, mine.value(), last=lease.revision),
                    leadership.LEASE_CALL_TIMEOUT,
                )
                return True
        except BadRequestError:  # KeyWrongLastSequenceError: someone wrote it since
            return await self._renew_if_ours(mine)
        return False

    async def _renew_if_ours(self, mine: Lease) -> bool:
        """After a refused create or renewal: an earlier call of ours that timed out
        may have been stored after all (the lease is ours, at a newer revision). Then
        renew it at that revision — a leader must not step down over its own write,
        and its lease is counted from this renewal."""
        current = await self._read_lease()
        if current is None or current.holder != self.settings.name:
            return False
        try:
            await asyncio.wait_for(
                self.leases.update(LEASE_KEY, mine.value(), last=current.revision),
                leadership.LEASE_CALL_TIMEOUT,
            )
        except BadRequestError:
            return False
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
        reports = await self._savepoint_reports()

        def catch_up(tx: Draft) -> None:
            reconciler.catch_up_savepoints(tx, self.observed, reports, self.settings)
            self._schedule(tx)

        await self._decide(catch_up)

    def _step_down(self, why: str) -> None:
        log.warning("%s steps down: %s", self.settings.name, why)
        self.leading = False
        if self.control_log is not None:
            self.control_log.guard(leading=False)

    # -- the one way state changes --------------------------------------------------------
    async def _decide(self, decide: Callable[[Draft], T]) -> T:
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

    def _schedule(self, tx: Draft, exclude: list[str] | None = None) -> None:
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
    def topology(self) -> Topology:
        return self.state.full_topology()

    def connection_for(self, node: str) -> Connection:
        s = self.settings
        return registry.connection_for(self.state, node, s.nats_url, s.hub_domain, s.replicas)

    def node(self, name: str) -> NodeRecord:
        return registry.node(self.state, name)

    async def register_node(self, reg: Registration) -> NodeRecord:
        def decide(tx: Draft) -> NodeRecord:
            record = registry.register(tx, reg)
            self._schedule(tx)
            return record

        before = self.state.nodes.get(reg.name)
        replaced = before is not None and before.agent_id not in (None, reg.agent_id)
        record = await self._decide(decide)
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

        await self._decide(decide)
        return self.node(name)

    async def remove_node(self, name: str) -> None:
        def decide(tx: Draft) -> None:
            registry.node(tx.state, name)
            self._move_off(tx, name, f"node {name} left")
            registry.remove(tx, name)

        await self._decide(decide)
        self.observed.forget(name)

    async def shed(self, node: str, request: ShedRequest) -> ShedAnswer:
        """An overloaded node asks for one of its fragments to move to a peer."""

        def decide(tx: Draft) -> Assignment:
            return rebalancer.shed(tx, node, request, self.observed, self.settings)

        a = await self._decide(decide)
        moving = self.state.assignments[a.fragment.id]
        return ShedAnswer.model_validate(
            {"fragment": a.fragment.id, "from": node, "to": moving.move_to, "epoch": a.epoch}
        )

    async def node_scaled(self, name: str, report: ScaleReport) -> NodeRecord:
        """A node on a Spark cluster changed its executor allocation: the control log
        (and the dashboard's control events) say so, with the pressure that made it."""
        await self._decide(lambda tx: registry.scaled(tx, name, report))
        return self.node(name)

    async def update_capabilities(self, name: str, caps: Capabilities) -> NodeRecord:
        def decide(tx: Draft) -> None:
            registry.update_capabilities(tx, name, caps)
            self._schedule(tx)
            self._rebalance(tx, f"capabilities of {name} changed")

        await self._decide(decide)
        return self.node(name)

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

        await self._decide(decide)
        return self.topology()

    # -- pipelines ------------------------------------------------------------------------
    def pipeline(self, name: str) -> PipelineRecord:
        return pipelines.pipeline(self.state, name)

    async def submit(self, sub: Submission) -> PipelineRecord:
        pinned = sub.model_copy(update={"spec": await with_model_needs(self.nc, sub.spec)})
        run_id = uuid.uuid4().hex[:8]

        def decide(tx: Draft) -> None:
            pipelines.submit(tx, pinned, run_id)
            self._schedule(tx)

        await self._decide(decide)
        return self.pipeline(sub.spec.name)

    async def cancel(self, name: str) -> PipelineRecord:
        await self._decide(lambda tx: pipelines.cancel(tx, name))
        return self.pipeline(name)

    async def savepoint(self, name: str) -> PipelineRecord:
        """Stop every fragment at a consistent checkpoint and keep a copy of it."""
        root = self.settings.savepoint_root
        await self._decide(lambda tx: pipelines.savepoint(tx, name, root))
        return self.pipeline(name)

    async def upgrade(self, spec: PipelineSpec) -> UpgradeReport:
        """Replace a running pipeline by a new version that keeps its state
        (:func:`spanflow.control.pipelines.upgrade`): refused with the reason per step,
        nothing stopped, when the state cannot be kept."""
        pinned = await with_model_needs(self.nc, spec)
        root = self.settings.savepoint_root
        reports: list[UpgradeReport] = []
        await self._decide(lambda tx: reports.append(pipelines.upgrade(tx, pinned, root)))
        return reports[-1]

    async def resume(self, name: str, savepoint: str | None = None) -> PipelineRecord:
        source = savepoint or self.pipeline(name).savepoint
        exists = source is not None and (locations.is_url(source) or Path(source).is_dir())

        def decide(tx: Draft) -> None:
            pipelines.resume(tx, name, source, exists)
            self._schedule(tx)

        await self._decide(decide)
        return self.pipeline(name)

    async def rebaseline(
        self,
        name: str,
        step: str | None,
        key: str | None,
        record: Mapping[str, Any] | None = None,
        by: str = "",
    ) -> records.DetectorRebaselined:
        """Accept a key's behaviour as normal in a detector (spanflow.ml.rebaseline)."""
        return await self._decide(lambda tx: pipelines.rebaseline(tx, name, step, key, record, by))

    # -- what nodes tell us ---------------------------------------------------------------
    async def _on_heartbeat(self, msg: Msg) -> None:
        hb = _parsed(msg, Heartbeat, "heartbeat")
        if hb is None or not self._sealed_by_node(msg, hb.node, (hb.agent_id, hb.seq, hb.at)):
            return
        now = self.clock.monotonic()
        heard = topology_manager.heard(self.state, self.observed, hb, now, self.settings.overload)
        if not heard or not self.leading:
            return  # the common case: progress only, no decision to take

        # Decide in a task of its own: a commit waiting for the log (an election after
        # a NATS server died) must not hold up the heartbeats behind this one, or
        # every node would look silent when it ends.
        task = asyncio.create_task(self._heartbeat_decision(hb.node, now))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _heartbeat_decision(self, node: str, now: float) -> None:
        def decide(tx: Draft) -> bool:
            recovered = topology_manager.recover(tx, node)
            if recovered:
                self._schedule(tx)
            reconciler.refresh_states(tx, self.observed)
            return recovered

        try:
            if await self._decide(decide):
                self.observed.joined(node, now)
        except Exception as exc:  # logged: the next heartbeat decides again
            log.warning("decision on %s's heartbeat not taken: %s", node, exc)

    async def _reconnected(self) -> None:
        """Back on NATS after a disconnection: we, not the nodes, were silent; give
        every live node a full period to be heard again."""
        log.warning("reconnected to NATS at %s", self.nc.connected_url if self.nc else "?")
        topology_manager.grace(self.state, self.observed, self.clock.monotonic(), reset=True)

    async def _on_activity(self, msg: Msg) -> None:
        act = _parsed(msg, Activity, "activity report")
        if act is None or not self._sealed_by_node(msg, act.node, act.at):
            return
        if not self.leading:
            if reconciler.current_assignment(self.state, act) is not None:
                self.observed.runtime[act.runtime.fragment_id] = act.runtime
            return

        def decide(tx: Draft) -> None:
            if reconciler.current_assignment(tx.state, act) is None:
                return  # about a placement that is no longer current
            self.observed.runtime[act.runtime.fragment_id] = act.runtime
            reconciler.on_activity(tx, self.observed, act, self.settings)

        await self._decide(decide)

    def _sealed_by_node(self, msg: Msg, node: str, when: tuple[str, int, float] | float) -> bool:
        """Whether a heartbeat (``when`` = agent id, sequence, time) or an activity
        report (its time) was sent by ``node`` itself (security/node_seal.py); a
        refusal is logged once a minute per node."""
        gate, now = self.reports, self.clock.time()
        sealed = (msg.headers or {}).get(SEAL_HEADER)
        if isinstance(when, tuple):
            why = gate.heartbeat_refusal(node, msg.subject, msg.data, sealed, when, now)
        else:
            why = gate.refusal(node, msg.subject, msg.data, sealed, when, now)
        if why is not None and gate.worth_logging(node, now):
            log.warning("report on %s refused: %s", msg.subject, why)
        return why is None

    async def _monitor(self) -> None:
        """Mark silent nodes failed and re-place their fragments; retry waiting
        pipelines; re-plan once joined nodes have settled."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval / 2)
            if not self.leading:
                continue
            try:
                settled = await self._decide(self._check)
                self.observed.unsettled -= set(settled)
            except Exception:
                log.exception("monitor pass failed")
            try:  # a decision of its own: a failure here never stops failure detection
                self._tell_new(await self._decide(self._follow_sites))
            except Exception:
                log.exception("following the sites failed")

    def _follow_sites(self, tx: Draft) -> dict[str, str]:
        return pipelines.follow_sites(tx, self.settings.savepoint_root, self._runtime_of)

    def _runtime_of(self, fragment_id: str) -> FragmentRuntime | None:
        """The latest report of the fragment's current assignment."""
        a = self.state.assignments.get(fragment_id)
        return self.observed.current(a) if a is not None else None

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
        self._schedule(tx)
        if self.settings.rebalance and now >= self._next_rebalance:
            self._next_rebalance = now + self.settings.rebalance_interval
            rebalancer.rebalance(tx, self.observed, self.settings, now)
        return scheduler.rebalance_settled(tx, self.observed, self.settings, now)

    # -- observation: what the REST API reads ------------------------------------------------
    def health(self) -> Health:
        return Health(ok=True, nodes=len(self.state.nodes), **self._who())

    def info(self) -> ClusterInfo:
        s = self.settings
        settings = ("nats_url", "hub_domain", "heartbeat_interval", "failure_after", "state_dir")
        return ClusterInfo(
            **self._who(),
            **{name: getattr(s, name) for name in settings},
            recovered_log_records=self.recovered_records,
            log_sequence=self.state.applied,
            leader_epoch=self.state.leader_epoch,
            leader_url=self.leader_url,
            lease_seconds=self.lease_seconds,
            token_required=s.token is not None,
        )

    def _who(self) -> dict[str, Any]:
        """This replica, its role and the leader, as every answer about it says."""
        return {"name": self.settings.name, "role": self.role, "leader": self.state.leader}

    def pipeline_statuses(self) -> list[PipelineStatus]:
        at = self.reach()
        return [
            views.pipeline_status(self.state, self.observed, n, at)
            for n in sorted(self.state.pipelines)
        ]

    def node_statuses(self) -> list[NodeStatus]:
        at = self.reach()
        return [
            views.node_status(self.state, self.observed, n, at) for n in sorted(self.state.nodes)
        ]

    def planned_fragments(self) -> list[tuple[str, str, str | None]]:
        """(pipeline, fragment, node or None when unplaced) of every fragment an active
        pipeline should be running."""
        out = []
        for name in sorted(self.state.pipelines):
            record = self.state.pipelines[name]
            if record.state.terminal or record.state == PipelineState.STOPPED:
                continue
            for f in record.fragments:
                a = self.state.assignments.get(f.id)
                out.append((name, f.id, a.node if a else None))
        return out

    def plan(self, pipeline: str) -> list[FragmentPlan]:
        """The fragments ``pipeline`` was cut into, each with where it runs and its own
        steps — those the planner added included (a site's partial aggregate, the read
        of another fragment's output) — secrets masked (NotFound)."""
        record = pipelines.pipeline(self.state, pipeline)
        out = []
        for f in pipelines.shown_fragments(self.state, record):
            a = self.state.assignments.get(f.id)
            out.append(
                FragmentPlan(
                    id=f.id,
                    kind=f.kind,
                    site=f.site,
                    node=a.node if a else None,
                    steps=f.spec.secret_free()["steps"],
                )
            )
        return out

    def shown_fragments(self, pipeline: str) -> list[str]:
        """The ids of the fragments the dashboard shows for ``pipeline`` (NotFound)."""
        record = pipelines.pipeline(self.state, pipeline)
        return [f.id for f in pipelines.shown_fragments(self.state, record)]

    def reach(self) -> views.Reach:
        """Which nodes can be believed now (every view takes it)."""
        return views.reach(
            self.state, self.observed, self.clock.monotonic(), self.settings.heartbeat_interval
        )

    def live_runtimes(self) -> dict[str, FragmentRuntime]:
        """Figures of the fragments that run where they can be believed now."""
        return views.live_runtimes(self.state, self.observed, self.reach())

    def pipeline_status(self, name: str) -> PipelineStatus:
        return views.pipeline_status(self.state, self.observed, name, self.reach())

    def pipeline_metrics(self, name: str) -> PipelineMetrics:
        return views.pipeline_metrics(self.state, self.observed, name, self.reach())

    def node_status(self, name: str) -> NodeStatus:
        return views.node_status(self.state, self.observed, name, self.reach())

    def cluster_metrics(self) -> ClusterMetrics:
        uptime = self.clock.monotonic() - self.started_at
        return views.cluster_metrics(self.state, self.observed, uptime, self.reach())


M = TypeVar("M", Heartbeat, Activity)


def _parsed(msg: Msg, model: type[M], what: str) -> M | None:
    """A node's report, or None (logged) when it is not one: a bad message is dropped,
    never the subscription."""
    try:
        return model.model_validate_json(msg.data)
    except ValidationError as exc:
        log.warning("bad %s on %s: %s", what, msg.subject, exc)
        return None
