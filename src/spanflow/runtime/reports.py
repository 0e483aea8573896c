"""What a node tells the others: heartbeats, activity, load, stream usage — and, when it
is overloaded, a request to move a fragment away.

Heartbeats (core NATS, every ``interval`` seconds, sooner when gossip changes a verdict)
carry load and per-fragment progress; fragment events (started, stopped, failed,
savepointed) and periodic progress go to the activity log. Everything here but
:meth:`Reports.report` runs as tasks on the NATS event-loop thread, so heartbeats keep
going while Spark is busy starting a query; a slow NATS answer never holds a beat
(stream usage is measured apart, each stream with its own time-out).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import psutil
from nats.js import JetStreamContext

from spanflow.clock import Clock
from spanflow.nats.cluster import ACTIVITY_STREAM, HEARTBEAT_PREFIX, activity_subject
from spanflow.nats.sourcing import SourcingWatch
from spanflow.nats.streams import SyncNats, ensure_stream, stream_usage
from spanflow.protocol.client import CoordinatorUnreachable
from spanflow.protocol.messages import Activity, ActivityEvent, Heartbeat, PeerView, ShedRequest
from spanflow.protocol.metrics import FragmentRuntime, StreamUsage
from spanflow.runtime.control_link import ControlLink, detail
from spanflow.runtime.fragments import LocalFragments
from spanflow.runtime.load import LoadReport, load_score
from spanflow.runtime.node_cpu import NodeCpu
from spanflow.runtime.shedding.policy import PeerLoad, ShedDecision, Shedder
from spanflow.security.node_seal import seal_headers
from spanflow.spec.cluster import NodeRecord
from spanflow.spec.retention import DEFAULT_RETENTION
from spanflow.spec.topology import Capabilities

if TYPE_CHECKING:
    from spanflow.runtime.gossip import AgentGossip

log = logging.getLogger(__name__)


class Reports:
    def __init__(
        self,
        node: str,
        agent_id: str,
        fragments: LocalFragments,
        link: ControlLink,
        shedder: Shedder,
        offered: Capabilities,
        clock: Clock,
    ) -> None:
        self.node, self.agent_id = node, agent_id
        self.fragments, self.link, self.shedder, self.clock = fragments, link, shedder, clock
        self.timings = link.settings.timings
        self.offered = offered
        """What this node offers (the registered spec's, once registered)."""
        self.node_cpu = NodeCpu(offered.cores)
        self.interval = 1.0
        self.retention = DEFAULT_RETENTION
        """Limits of the streams this node creates: its site's (from the topology)."""
        self.client: SyncNats | None = None
        self.control: JetStreamContext | None = None
        """JetStream of the control plane (activity log)."""
        self.gossip: AgentGossip | None = None
        self.gossip_addr: str | None = None
        self.cut_off: Callable[[], bool] = lambda: True
        """Whether the node is cut off from the control plane's assignments (and runs
        its last-known ones)."""
        self.ready = threading.Event()
        self.hosted: dict[str, float] = {}
        """Streams born here → the share of their limit at which usage is a warning."""
        self.load: LoadReport | None = None
        self._usage: list[StreamUsage] = []
        self._seq = 0
        self._beat_now: asyncio.Event | None = None
        self._disconnected_since: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.token: str | None = None
        """This node's token (locked): seals its heartbeats and activity reports, so
        no other host can send them in its name (security/node_seal.py)."""

    # -- the data path, as gossip tells it ---------------------------------------------
    def data_path_up(self) -> bool:
        """Whether this node's data path (NATS) is up, as its peers' gossip tells the
        coordinator: connected, or reconnecting for less than ``reconnect_grace``
        (a NATS server died and its clients move to another: the node is not broken)."""
        client = self.client
        if client is None:
            return False
        now = self.clock.monotonic()
        if client.nc.is_connected:
            self._disconnected_since = None
            return True
        if self._disconnected_since is None:
            self._disconnected_since = now
        grace = self.timings.reconnect_grace
        return bool(client.nc.is_reconnecting) and now - self._disconnected_since < grace

    def beat_soon(self, _changes: object = None) -> None:
        """A peer changed state in this node's membership: tell the coordinator at once
        (the next heartbeat carries it) instead of up to a heartbeat period later."""
        client, event = self.client, self._beat_now
        if client is not None and event is not None:
            client.call_soon(event.set)

    # -- heartbeats ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start heartbeats, usage measurement and the sourcing watch (on NATS's loop)."""
        self._beat_now = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._tasks += [
            loop.create_task(self._heartbeats()),
            loop.create_task(self._measure_usage()),
            loop.create_task(self._watch_sourcing()),
        ]

    async def _heartbeats(self) -> None:
        psutil.cpu_percent(interval=None)
        assert self._beat_now is not None
        while True:
            await self._beat()
            with contextlib.suppress(TimeoutError):  # not wait_for: see udp.GossipService
                async with asyncio.timeout(self.interval):
                    await self._beat_now.wait()
            self._beat_now.clear()

    async def _beat(self) -> None:
        self._seq += 1
        cpu, memory = psutil.cpu_percent(interval=None), psutil.virtual_memory().percent
        load = self.measure_load(self.node_cpu.percent(), memory)
        gossip = self.gossip
        peers = await gossip.aview() if gossip is not None else {}
        self._consider_shedding(load, peers)
        hb = Heartbeat(
            node=self.node,
            agent_id=self.agent_id,
            seq=self._seq,
            cpu_percent=cpu,
            memory_percent=memory,
            slots=len(self.fragments.desired),
            fragments=dict(self.fragments.runtime),
            streams=self._usage,  # measured apart: a beat never waits on NATS
            last_known=self.cut_off(),
            ready=self.ready.is_set(),
            load=load.score,
            bottleneck=load.bottleneck if load.score > 0 else None,
            gossip=self.gossip_addr,
            peers=peers,
            gossip_rejected=gossip.service.stats.rejected if gossip else 0,
        )
        assert self.client is not None
        try:
            subject, data = f"{HEARTBEAT_PREFIX}.{self.node}", hb.model_dump_json().encode()
            headers = seal_headers(self.token, subject, data)
            await self.client.nc.publish(subject, data, headers=headers)
        except Exception as exc:
            log.warning("heartbeat not sent: %s", exc)

    def measure_load(self, cpu: float, memory: float) -> LoadReport:
        """This node's load score (gossiped to its peers and sent to the coordinator)."""
        running = [f.load for f in self.fragments.running() if f.load is not None]
        self.load = load_score(cpu, memory, running)
        if self.gossip is not None:
            # No free slot to offer until this node's Spark runs: a peer asking it to take
            # a fragment would only be refused (and remember the refusal).
            ready = self.fragments.executor is not None
            taken = self.fragments.slots_taken(self.offered)
            free = max(0, self.offered.fragment_slots - taken) if ready else 0
            self.gossip.set_load(self.load.score, free, self.data_path_up())
        return self.load

    # -- shedding ------------------------------------------------------------------------
    def _consider_shedding(self, load: LoadReport, peers: dict[str, PeerView]) -> None:
        """Over the threshold for long enough: ask the coordinator to move a fragment to
        the least-loaded peer gossip knows of (in the background)."""
        candidates = [
            PeerLoad(name, v.load, v.free_slots or 0, v.load_age_s or 0.0)
            for name, v in peers.items()
            if v.state == "alive" and v.load is not None and v.load_age_s is not None
        ]
        now = self.clock.monotonic()
        request = self.shedder.observe(now, load.score, self.fragments.running(), candidates)
        if request is not None and not self.link.offline:
            self.shedder.sent(now)
            self._tasks.append(asyncio.get_running_loop().create_task(self._ask_to_shed(request)))

    async def _ask_to_shed(self, request: ShedDecision) -> None:
        body = ShedRequest(
            fragment=request.fragment,
            to=request.to,
            load=request.load,
            peer_load=request.peer_load,
            reason=request.reason,
        )
        log.warning(
            "overloaded: asking to move %s to %s (%s)", request.fragment, request.to, request.reason
        )
        try:
            answer = await asyncio.to_thread(self.link.ask_to_shed, body)
        except CoordinatorUnreachable as exc:
            log.warning("shed request for %s not answered: %s", request.fragment, exc)
            return
        rt = self.fragments.runtime.get(request.fragment) or FragmentRuntime(
            fragment_id=request.fragment, epoch=0, status="running"
        )
        if answer.status_code < 300:
            said = f"moving to {request.to}: {request.reason}"
            await asyncio.to_thread(self.report, "shed-requested", rt, detail=said)
            return
        self.shedder.refused(request, self.clock.monotonic())
        log.warning("shed request for %s refused: %s", request.fragment, detail(answer))
        said = f"{request.to} refused: {detail(answer)}"
        await asyncio.to_thread(self.report, "shed-refused", rt, detail=said)

    # -- streams -------------------------------------------------------------------------
    async def _measure_usage(self) -> None:
        """How full the streams this node hosts and its fragments use are, every
        ``usage_every`` seconds, apart from the heartbeat: while a stream elects a leader
        its info takes seconds, and a heartbeat that waited on it would let the
        coordinator fail a healthy node."""
        while True:
            if self.client is not None:
                self._usage = await self._stream_usage(self.client.js)
            await asyncio.sleep(self.timings.usage_every)

    def ensure_hosted_streams(self, client: SyncNats, node: NodeRecord) -> None:
        """Create the streams this node hosts (data is born here), so devices can publish
        before any pipeline runs; their fill is reported with the rest."""
        for stream in node.spec.streams:
            name, subjects = stream.name, list(stream.subjects or [])
            retention = stream.retention or self.retention
            if subjects:
                client.run(partial(ensure_stream, client.js, name, subjects, retention=retention))
                self.hosted[name] = retention.warn_at

    async def _stream_usage(self, js: JetStreamContext) -> list[StreamUsage]:
        """Each stream asked concurrently, with its own time-out; one that does not
        answer keeps its last figure."""
        wanted = dict(self.hosted)
        executor = self.fragments.executor
        for running in list(executor.fragments.values()) if executor else []:
            for name in running.runner.provisioned.streams:
                wanted.setdefault(name, self.retention.warn_at)

        async def look(name: str, warn_at: float) -> StreamUsage | None:
            try:
                async with asyncio.timeout(self.timings.usage_timeout):
                    return await stream_usage(js, name, warn_at=warn_at)
            except Exception as exc:  # electing, or briefly unreachable: its last figure
                log.debug("no usage of stream %s: %s", name, exc)
                return next((u for u in self._usage if u.stream == name), None)

        found = await asyncio.gather(*(look(n, w) for n, w in wanted.items()))
        for usage in found:
            before = [u for u in self._usage if u.stream == usage.stream] if usage else []
            if usage is not None and usage.warning and not any(u.warning for u in before):
                log.warning("%s", usage.warning)
        return [u for u in found if u is not None]

    async def _watch_sourcing(self) -> None:
        """Revive the copies of other sites' streams this node's fragments read that
        stalled while their site's link is back (nats/sourcing.py): the broker's own
        retries would wait up to two minutes after a long cut."""
        watch: SourcingWatch | None = None
        while True:
            await asyncio.sleep(self.timings.sourcing_check_every)
            executor, client = self.fragments.executor, self.client
            if executor is None or client is None:
                continue
            if watch is None or watch.nc is not client.nc:
                watch = SourcingWatch(client.nc)
            names = {
                n for r in list(executor.fragments.values()) for n in r.runner.provisioned.sourced
            }
            try:
                await watch.check(sorted(names))
            except Exception:
                log.exception("sourcing watch failed")

    # -- activity ------------------------------------------------------------------------
    def report(
        self,
        event: ActivityEvent,
        rt: FragmentRuntime,
        savepoint_dir: str | None = None,
        detail: str | None = None,
    ) -> None:
        """One fragment event to the activity log (blocking; never raises)."""
        client, control = self.client, self.control
        if client is None or control is None:
            return
        act = Activity(
            node=self.node,
            agent_id=self.agent_id,
            event=event,
            runtime=rt,
            savepoint_dir=savepoint_dir,
            detail=detail,
        )
        subject = activity_subject(self.node, rt.fragment_id, event)
        data = act.model_dump_json().encode()
        headers = seal_headers(self.token, subject, data)
        t = self.timings
        try:
            client.run(
                lambda: control.publish(subject, data, stream=ACTIVITY_STREAM, headers=headers),
                timeout=t.report_timeout_cut_off if self.cut_off() else t.report_timeout,
            )
        except Exception as exc:
            log.warning("activity report %s for %s not sent: %s", event, rt.fragment_id, exc)
