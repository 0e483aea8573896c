"""The node agent: registers with the coordinator, then runs whatever its assignments say.

The agent learns what to run by watching its own keys (``<node>.>``) in the
assignments bucket, not from the coordinator directly, so the coordinator may
restart, or be unreachable for a while, without any query stopping. Heartbeats
(core NATS, every ``heartbeat_interval``) carry load and per-fragment progress;
fragment events (started, stopped, failed, savepointed) and periodic progress go to
the activity log.

Threads: NATS runs on a private event-loop thread (heartbeats and the KV watch keep
going while Spark is busy starting a query); Spark is driven from the agent's main
thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from spanflow.errors import SpanflowError
from spanflow.nats.cluster import (
    ACTIVITY_STREAM,
    ASSIGNMENTS_BUCKET,
    HEARTBEAT_PREFIX,
    activity_subject,
    ensure_kv,
)
from spanflow.nats.server import default_data_dir
from spanflow.nats.sourcing import SourcingWatch
from spanflow.nats.streams import SyncNats, ensure_stream, stream_usage
from spanflow.protocol.client import parse_urls
from spanflow.protocol.rest import Registered, Registration
from spanflow.runtime.executor import FragmentExecutor
from spanflow.runtime.gossip import AgentGossip
from spanflow.runtime.load import FragmentLoad, LoadReport, load_score
from spanflow.runtime.membership.protocol import Change
from spanflow.runtime.node_cpu import NodeCpu
from spanflow.runtime.reconcile import (
    Failure,
    Forget,
    Savepoint,
    Stop,
    reconcile,
    savepoint_marker,
)
from spanflow.runtime.registration import LAST_ASSIGNMENTS_BUCKET, Backoff, RegistrationCache
from spanflow.runtime.shedding.policy import (
    PeerLoad,
    Running,
    ShedDecision,
    Shedder,
    SheddingConfig,
)
from spanflow.security.https import client_context
from spanflow.security.secrets import assignment_verifier, secrets_from_env
from spanflow.security.signing import Unsigned, read_signed
from spanflow.spec.cluster import (
    Activity,
    ActivityEvent,
    Assignment,
    FragmentRuntime,
    Heartbeat,
    NodeRecord,
    PeerView,
    ShedRequest,
    StreamUsage,
)
from spanflow.spec.retention import DEFAULT_RETENTION
from spanflow.spec.topology import Capabilities

log = logging.getLogger(__name__)

PROGRESS_EVERY = 5.0
USAGE_EVERY = 10.0
USAGE_TIMEOUT = 3.0
SOURCING_CHECK_EVERY = 1.0
CONTROL_PATIENCE_OFFLINE = 3.0
"""Seconds an agent started from its saved registration waits for the control plane's
assignments before it runs its last-known ones."""
"""Seconds one stream's usage may take to answer; it keeps its last figure otherwise."""
RECONNECT_GRACE = 20.0
"""Seconds a node whose NATS connection is re-establishing still reports its data path
up: longer than JetStream's failover (about 11 s, see control.leadership), so losing
one NATS server never fails the nodes that were connected to it."""
REJOIN_EVERY = 10.0
"""Longest wait between attempts to reach the control plane after starting without it."""
"""Seconds between looks at how full the streams this node uses are (in heartbeats)."""


class AgentError(SpanflowError):
    code = "agent_error"


@dataclass
class AgentSettings:
    name: str
    site: str
    coordinator_url: str
    token: str | None = None
    capabilities: Capabilities | None = None
    master: str | None = None
    offline_after: float = 10.0
    """Seconds without an answer from the coordinator after which a node that has
    registered before starts from its saved registration (it keeps trying)."""
    state_dir: Path | None = None
    """Where the agent keeps its last registration (default: spanflow's data dir)."""
    spark_conf: dict[str, str] = field(default_factory=dict)
    batch_offset: float = 0.0
    """Shift of this node's batch start slots, a fraction of the trigger interval: nodes
    sharing one machine take different ones (:mod:`spanflow.spark.stagger`)."""
    nats_url: str | None = None
    """Reach NATS here instead of at the URL the coordinator names (a proxy, a NAT, a
    different route to the same server)."""
    gossip: bool = True
    """Run membership (SWIM) with the other nodes of this node's partition."""
    gossip_bind: str = "127.0.0.1"
    gossip_port: int = 0
    """UDP and TCP port of the membership endpoint (0: a free one)."""
    gossip_advertise: str | None = None
    """The address peers reach it at, when not the bind address (NAT, 0.0.0.0)."""
    gossip_profile: str | None = None
    """``lan``, ``wan`` or ``local_test``; None: the coordinator's choice."""
    shedding: SheddingConfig = field(default_factory=SheddingConfig)
    """When this node asks a peer to take one of its fragments (docs/balancing.md)."""


def detect_capabilities() -> Capabilities:
    cores = os.cpu_count() or 1
    memory_mb = int(psutil.virtual_memory().total / (1024 * 1024))
    return Capabilities(cores=cores, memory_mb=memory_mb)


class NodeAgent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.agent_id = uuid.uuid4().hex[:12]
        self.nats_url = ""
        self.control_domain: str | None = None
        """JetStream domain of the control plane (KV, activity log) when this node's
        site has its own server; None when both are the cluster's server."""
        self.site_domain: str | None = None
        self.retention = DEFAULT_RETENTION
        """Limits of the streams this node creates: its site's (from the topology)."""
        self.interval = 1.0
        self._client: SyncNats | None = None
        self._kv: KeyValue | None = None
        self._verifier = assignment_verifier()
        self._tls = client_context()
        """How https:// coordinators are checked (the deployment's CA when locked): made
        once, not at every registration attempt or shed request."""
        self.refused_assignments = 0
        """Assignment values whose signature did not verify (forged, not run)."""
        self._control_js: JetStreamContext | None = None
        self._changes: queue.Queue[tuple[str, Assignment | None]] = queue.Queue()
        self._desired: dict[str, Assignment] = {}
        self._failed: dict[str, Failure] = {}
        self._savepointed: set[tuple[str, int, str]] = set()
        self._runtime: dict[str, FragmentRuntime] = {}
        self._hb_seq = 0
        self._hosted: dict[str, float] = {}
        """Streams born here → the share of their limit at which usage is a warning."""
        self._usage: list[StreamUsage] = []
        self._executor: FragmentExecutor | None = None
        self._last_progress = 0.0
        self.ready = threading.Event()
        directory = settings.state_dir or default_data_dir() / "agents"
        self._cache = RegistrationCache(directory, settings.name)
        self._next_coordinator = 0
        """Index (modulo the list) of the coordinator URL to try next."""
        self.offline = False
        """Started from the saved registration; not registered with a coordinator yet."""
        self._site_kv: KeyValue | None = None
        self._stop: threading.Event | None = None
        self._bg: list[asyncio.Task[None]] = []
        self._disconnected_since: float | None = None
        self.gossip = (
            AgentGossip(
                settings.name,
                bind=settings.gossip_bind,
                port=settings.gossip_port,
                advertise=settings.gossip_advertise,
                on_verdict=self._gossip_verdict,
                connected=self._nats_connected,
                keyring_file=_keyring_file(),
            )
            if settings.gossip
            else None
        )
        self._gossip_addr: str | None = None
        self.shedder = Shedder(settings.shedding)
        self.offered = settings.capabilities or detect_capabilities()
        """What this node offers (the registered spec's, once registered)."""
        self._node_cpu = NodeCpu(self.offered.cores)
        self._beat_now: asyncio.Event | None = None
        self.load: LoadReport | None = None

    # -- registration ----------------------------------------------------------------
    def register(self, *, once: bool = False) -> Registered | None:
        """Register, retrying with back-off for as long as it takes (4xx answers are
        final). A node that registered before starts from its saved registration once
        the coordinator has not answered for ``offline_after`` seconds (``offline``
        is then set; registration goes on in the background). ``once``: one attempt,
        None when the coordinator cannot be reached."""
        s = self.settings
        if self.gossip is not None and self._gossip_addr is None:
            self._gossip_addr = self.gossip.bind()
        body = Registration(
            name=s.name,
            site=s.site,
            agent_id=self.agent_id,
            host=socket.gethostname(),
            gossip=self._gossip_addr,
            capabilities=s.capabilities,
            detected=detect_capabilities(),
        ).model_dump(mode="json", exclude_none=True)
        headers = {"Authorization": f"Bearer {s.token}"} if s.token else {}
        urls = parse_urls(s.coordinator_url)
        backoff = Backoff()
        offline_at = time.monotonic() + s.offline_after
        while True:
            # Each coordinator of the list in turn (a standby redirects to the leader).
            url, problem = self._coordinator(urls), ""
            # A saved registration is used offline_after seconds in, not a hung request later.
            left = offline_at - time.monotonic()
            patience = min(10.0, max(1.0, left)) if self._cache.path.exists() else 10.0
            try:
                r = httpx.post(
                    f"{url}/api/v1/nodes",
                    json=body,
                    headers=headers,
                    timeout=patience,
                    follow_redirects=True,
                    verify=self._tls,
                )
                problem = f"answered {r.status_code}" if r.status_code >= 500 else ""
            except httpx.HTTPError as exc:
                problem = str(exc) or type(exc).__name__
            if not problem:
                break
            self._next_coordinator += 1
            if self._next_coordinator % len(urls):
                continue  # try the next coordinator of the list at once
            if once:
                return None
            saved = self._cache.load()
            if saved is not None and time.monotonic() >= offline_at:
                log.warning(
                    "coordinators %s unreachable (%s): starting from the registration saved "
                    "in %s; registering again in the background",
                    s.coordinator_url,
                    problem,
                    self._cache.path,
                )
                self.offline = True
                self._apply(saved)
                return saved
            delay = backoff.next()
            log.warning(
                "coordinators %s unreachable (%s); retrying in %.1f s",
                s.coordinator_url,
                problem,
                delay,
            )
            time.sleep(delay)
        if r.status_code >= 400:
            raise AgentError(f"registration refused ({r.status_code}): {_detail(r)}")
        answer = Registered.model_validate_json(r.content)
        self._apply(answer)
        self._cache.save(answer)
        self.offline = False
        return answer

    def _coordinator(self, urls: list[str]) -> str:
        return urls[self._next_coordinator % len(urls)]

    def _apply(self, answer: Registered) -> None:
        self.nats_url = self.settings.nats_url or answer.nats_url
        self.control_domain = answer.control_domain
        self.site_domain = answer.site_domain
        if answer.retention is not None:
            self.retention = answer.retention
        self.interval = answer.heartbeat_interval
        self.offered = answer.node.spec.capabilities
        self._node_cpu.cores = self.offered.cores
        if self.gossip is not None:
            profile = self.settings.gossip_profile or answer.gossip_profile or "lan"
            self.gossip.start(profile, list(answer.gossip_peers))

    def _nats_connected(self) -> bool:
        """Whether this node's data path (NATS) is up, as its peers' gossip tells the
        coordinator: connected, or reconnecting for less than :data:`RECONNECT_GRACE`
        (a NATS server died and its clients move to another: the node is not broken)."""
        client = self._client
        if client is None:
            return False
        now = time.monotonic()
        if client.nc.is_connected:
            self._disconnected_since = None
            return True
        if self._disconnected_since is None:
            self._disconnected_since = now
        return bool(client.nc.is_reconnecting) and now - self._disconnected_since < RECONNECT_GRACE

    def _gossip_verdict(self, changes: list[Change]) -> None:
        """A peer changed state in this node's membership: tell the coordinator at once
        (the next heartbeat carries it) instead of up to a heartbeat period later."""
        client, event = self._client, self._beat_now
        if client is not None and event is not None:
            client.call_soon(event.set)

    # -- main loop -------------------------------------------------------------------
    def _ensure_hosted_streams(self, node: NodeRecord) -> None:
        """Create the streams this node hosts (data is born here), so devices can publish
        before any pipeline runs."""
        client = self._client
        assert client is not None
        for stream in node.spec.streams:
            name, subjects = stream.name, list(stream.subjects or [])
            retention = stream.retention or self.retention
            if subjects:
                client.run(partial(ensure_stream, client.js, name, subjects, retention=retention))
                self._hosted[name] = retention.warn_at

    def run(self, stop: threading.Event, after_spark: Callable[[], None] | None = None) -> None:
        """Register, start Spark, then run assignments until ``stop`` is set.

        ``after_spark`` runs once the SparkSession exists (PySpark replaces the process's
        SIGINT handler when it starts; the CLI puts its own back there)."""
        self._stop = stop
        warm = self._warm_up_spark()
        try:
            answer = self.register()
        except BaseException:
            if warm is not None:
                warm.discard()
            raise
        assert answer is not None
        log.info(
            "node %s %s (agent %s); NATS %s",
            self.settings.name,
            "starting from its saved registration" if self.offline else "registered",
            self.agent_id,
            self.nats_url,
        )
        client = self._client = SyncNats(self.nats_url)
        self._control_js = client.nc.jetstream(domain=self.control_domain)
        if self.site_domain is not None:
            site = client.nc.jetstream(domain=self.site_domain)
            self._site_kv = client.run(
                lambda: ensure_kv(site, LAST_ASSIGNMENTS_BUCKET, replicas=self.retention.replicas)
            )
        self._ensure_hosted_streams(answer.node)
        if not self._connect_control():
            if self._site_kv is None:
                raise AgentError(f"the control plane at {self.nats_url} is unreachable")
            self._desired = client.run(self._last_known)
            log.warning(
                "control plane unreachable: running the %d last-known assignment(s) of %s "
                "from site %s; reconciling when it returns",
                len(self._desired),
                self.settings.name,
                self.site_domain,
            )
        client.run(self._start_heartbeats)
        if self.offline or self._kv is None:
            threading.Thread(target=self._rejoin, name="rejoin", daemon=True).start()
        spark = self._spark(answer.node.spec.capabilities, warm)
        if after_spark is not None:
            after_spark()
        self._executor = FragmentExecutor(
            spark,
            self.nats_url,
            domain=self.site_domain,
            batch_offset=self.settings.batch_offset,
            retention=self.retention,
            node=self.settings.name,
        )
        self.ready.set()
        try:
            while not stop.is_set():
                self._drain_changes(timeout=self.interval / 2)
                self._reconcile()
                self._executor.supervise()
                self._observe()
        finally:
            self._executor.stop_all()
            if self.gossip is not None:
                self.gossip.close(leave=True)
            client.close()

    def _spark_master(self, caps: Capabilities) -> str:
        # A node offers `cores` cores: local mode uses that many task threads, plus the
        # slots its Real-Time Mode queries hold for their whole batches.
        return (
            self.settings.master
            or os.environ.get("SPANFLOW_SPARK_MASTER")
            or f"local[{caps.cores + caps.realtime_slots},3]"
        )

    def _warm_up_spark(self) -> SparkWarmUp | None:
        """A restarted node (one with a saved registration) starts its Spark session
        while it registers, with the capabilities it registered with last time: during
        an uplink cut registration waits up to ``offline_after`` for the coordinator,
        and the session's few seconds no longer come after that wait."""
        saved = self._cache.load()
        if saved is None:
            return None  # a first registration may change what the node offers
        master = self._spark_master(saved.node.spec.capabilities)
        return SparkWarmUp(master, f"spanflow-{self.settings.name}", self.settings.spark_conf)

    def _spark(self, caps: Capabilities, warm: SparkWarmUp | None) -> Any:
        """The session for this node's fragments: the warmed one when the registration
        kept its master, else one built now."""
        from spanflow.spark.session import build_session  # Spark only once registered

        master = self._spark_master(caps)
        if warm is not None:
            if warm.master == master:
                return warm.session()
            log.info("capabilities changed since the last registration: Spark starts again")
            warm.discard()
        return build_session(
            master=master, app_name=f"spanflow-{self.settings.name}", conf=self.settings.spark_conf
        )

    def _connect_control(self) -> bool:
        """Open the assignments bucket and watch this node's keys; False when the
        control plane's JetStream cannot be reached (an edge site's uplink is down)."""
        client, control = self._client, self._control_js
        assert client is not None and control is not None
        # Offline (a saved registration), the uplink is likely down: do not hold up
        # the last-known assignments for long; the background rejoin keeps trying.
        patience = CONTROL_PATIENCE_OFFLINE if self.offline else 15.0
        try:
            self._kv = client.run(lambda: ensure_kv(control, ASSIGNMENTS_BUCKET), timeout=patience)
        except Exception as exc:
            log.warning("assignments unreachable: %s", exc or type(exc).__name__)
            return False
        client.run(self._start_watch)
        return True

    def _rejoin(self) -> None:
        """In the background, with back-off: register with a coordinator and reach the
        control plane's assignments; the main loop then reconciles with them."""
        backoff = Backoff(initial=1.0, cap=REJOIN_EVERY)
        stop = self._stop
        while stop is None or not stop.is_set():
            if self.offline:
                try:
                    self.register(once=True)
                except AgentError as exc:
                    log.error("registration refused: %s", exc)
            if self._kv is None and self._connect_control():
                log.info("control plane reachable again: reconciling with its assignments")
            if not self.offline and self._kv is not None:
                log.info("node %s registered (agent %s)", self.settings.name, self.agent_id)
                return
            delay = backoff.next()
            if stop is not None:
                stop.wait(delay)
            else:  # pragma: no cover - run() always sets it
                time.sleep(delay)

    async def _last_known(self) -> dict[str, Assignment]:
        """This node's assignments as its site's server last saw them."""
        kv = self._site_kv
        assert kv is not None
        out: dict[str, Assignment] = {}
        for key in await self._site_keys():
            try:
                entry = await kv.get(key)
                if entry.value:
                    out[key.partition(".")[2]] = self._assignment(entry.value)
            except (KeyNotFoundError, ValueError, Unsigned) as exc:
                log.error("unreadable last-known assignment %s: %s", key, exc)
        return out

    def _assignment(self, value: bytes) -> Assignment:
        """An assignment value as this node may run it: locked, only what the
        coordinators signed (:class:`Unsigned` otherwise)."""
        return Assignment.model_validate_json(read_signed(value, self._verifier))

    async def _site_keys(self) -> list[str]:
        """This node's keys in its site's copy of its assignments."""
        kv = self._site_kv
        assert kv is not None
        prefix = f"{self.settings.name}."
        try:
            return [k for k in await kv.keys() if k.startswith(prefix)]
        except NoKeysError:
            return []

    async def _remember(self, key: str, value: bytes | None) -> None:
        """Keep the site's copy of this node's assignments current."""
        kv = self._site_kv
        if kv is None:
            return
        try:
            if value is None:
                await kv.delete(key)
            else:
                await kv.put(key, value)
        except Exception as exc:
            log.warning("last-known assignment %s not kept: %s", key, exc)

    async def _forget_others(self, current: set[str]) -> None:
        """After the control plane's current assignments arrived: the site's copies of
        any others are stale (removed while this node was away)."""
        kv = self._site_kv
        if kv is None:
            return
        for key in set(await self._site_keys()) - current:
            await self._remember(key, None)

    async def _start_watch(self) -> None:
        assert self._kv is not None
        watcher = await self._kv.watch(f"{self.settings.name}.>")

        async def watch() -> None:
            current: set[str] | None = set()  # keys of the initial values, until they end
            async for entry in watcher:
                if entry is None:
                    if current is not None:
                        await self._forget_others(current)
                        current = None
                    continue
                if entry.operation in ("DEL", "PURGE") or not entry.value:
                    self._changes.put((entry.key, None))
                    await self._remember(entry.key, None)
                    continue
                try:
                    self._changes.put((entry.key, self._assignment(entry.value)))
                except Unsigned as exc:
                    self.refused_assignments += 1
                    log.error("assignment %s refused, not run: %s", entry.key, exc)
                    continue
                except ValueError as exc:
                    log.error("unreadable assignment %s: %s", entry.key, exc)
                    continue
                await self._remember(entry.key, entry.value)
                if current is not None:
                    current.add(entry.key)

        self._bg.append(asyncio.get_running_loop().create_task(watch()))

    async def _start_heartbeats(self) -> None:
        self._beat_now = asyncio.Event()

        async def heartbeat() -> None:
            psutil.cpu_percent(interval=None)
            while True:
                self._hb_seq += 1
                cpu, memory = psutil.cpu_percent(interval=None), psutil.virtual_memory().percent
                load = self._measure_load(self._node_cpu.percent(), memory)
                peers = await self.gossip.aview() if self.gossip is not None else {}
                self._consider_shedding(load, peers)
                hb = Heartbeat(
                    node=self.settings.name,
                    agent_id=self.agent_id,
                    seq=self._hb_seq,
                    cpu_percent=cpu,
                    memory_percent=memory,
                    slots=len(self._desired),
                    fragments=dict(self._runtime),
                    streams=self._usage,  # measured apart: a beat never waits on NATS
                    last_known=self._kv is None,
                    ready=self.ready.is_set(),
                    load=load.score,
                    bottleneck=load.bottleneck if load.score > 0 else None,
                    gossip=self._gossip_addr,
                    peers=peers,
                    gossip_rejected=self.gossip.service.stats.rejected if self.gossip else 0,
                )
                assert self._client is not None
                try:
                    await self._client.nc.publish(
                        f"{HEARTBEAT_PREFIX}.{self.settings.name}", hb.model_dump_json().encode()
                    )
                except Exception as exc:
                    log.warning("heartbeat not sent: %s", exc)
                assert self._beat_now is not None
                with contextlib.suppress(TimeoutError):  # not wait_for: see udp.GossipService
                    async with asyncio.timeout(self.interval):
                        await self._beat_now.wait()
                self._beat_now.clear()

        loop = asyncio.get_running_loop()
        self._bg.append(loop.create_task(heartbeat()))
        self._bg.append(loop.create_task(self._measure_usage()))
        self._bg.append(loop.create_task(self._watch_sourcing()))

    def _slots_taken(self) -> int:
        """Fragment slots the assigned fragments take, counted as the planner does."""
        caps = self.offered
        return sum(a.fragment.slots_on(caps) for a in self._desired.values())

    def _running(self) -> list[Running]:
        """Fragments running here, with what the shedding policy weighs."""
        out = []
        for fid, rt in list(self._runtime.items()):
            a = self._desired.get(fid)
            if rt.status != "running" or a is None or a.action != "run":
                continue
            trigger_ms = int(a.fragment.spec.trigger * 1000)
            load = FragmentLoad.of(rt, trigger_ms)
            slots = a.fragment.spec.fragment_slots()
            out.append(Running(fid, a.priority, a.latency_budget, load, slots))
        return out

    def _measure_load(self, cpu: float, memory: float) -> LoadReport:
        """This node's load score (gossiped to its peers and sent to the coordinator)."""
        running = [f.load for f in self._running() if f.load is not None]
        self.load = load_score(cpu, memory, running)
        if self.gossip is not None:
            # No free slot to offer until this node's Spark runs: a peer asking it to take
            # a fragment would only be refused (and remember the refusal).
            ready = self._executor is not None
            free = max(0, self.offered.fragment_slots - self._slots_taken()) if ready else 0
            self.gossip.set_load(self.load.score, free, self._nats_connected())
        return self.load

    def _consider_shedding(self, load: LoadReport, peers: dict[str, PeerView]) -> None:
        """Over the threshold for long enough: ask the coordinator to move a fragment to
        the least-loaded peer gossip knows of (in the background)."""
        candidates = [
            PeerLoad(name, v.load, v.free_slots or 0, v.load_age_s or 0.0)
            for name, v in peers.items()
            if v.state == "alive" and v.load is not None and v.load_age_s is not None
        ]
        request = self.shedder.observe(time.monotonic(), load.score, self._running(), candidates)
        if request is not None and not self.offline:
            self.shedder.sent(time.monotonic())
            task = asyncio.get_running_loop().create_task(self._ask_to_shed(request))
            self._bg.append(task)

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
            answer = await asyncio.to_thread(self._post_shed, body)
        except httpx.HTTPError as exc:
            log.warning("shed request for %s not answered: %s", request.fragment, exc)
            return
        rt = self._runtime.get(request.fragment) or FragmentRuntime(
            fragment_id=request.fragment, epoch=0, status="running"
        )
        if answer.status_code < 300:
            detail = f"moving to {request.to}: {request.reason}"
            await asyncio.to_thread(self._report, "shed-requested", rt, detail=detail)
            return
        self.shedder.refused(request, time.monotonic())
        detail = f"{request.to} refused: {_detail(answer)}"
        log.warning("shed request for %s refused: %s", request.fragment, _detail(answer))
        await asyncio.to_thread(self._report, "shed-refused", rt, detail=detail)

    def _post_shed(self, body: ShedRequest) -> httpx.Response:
        s = self.settings
        headers = {"Authorization": f"Bearer {s.token}"} if s.token else {}
        url = self._coordinator(parse_urls(s.coordinator_url))
        return httpx.post(
            f"{url}/api/v1/nodes/{s.name}/shed",
            json=body.model_dump(),
            headers=headers,
            timeout=10,
            follow_redirects=True,
            verify=self._tls,
        )

    async def _measure_usage(self) -> None:
        """How full the streams this node hosts and its fragments use are, every
        USAGE_EVERY seconds, apart from the heartbeat: while a stream elects a leader
        its info takes seconds, and a heartbeat that waited on it would let the
        coordinator fail a healthy node. Each stream is asked concurrently, with its
        own time-out; one that does not answer keeps its last figure."""
        while True:
            if self._client is not None:
                self._usage = await self._stream_usage(self._client.js)
            await asyncio.sleep(USAGE_EVERY)

    async def _watch_sourcing(self) -> None:
        """Every second, revive the copies of other sites' streams this node's fragments
        read that stalled while their site's link is back (nats/sourcing.py): the
        broker's own retries would wait up to two minutes after a long cut."""
        watch: SourcingWatch | None = None
        while True:
            await asyncio.sleep(SOURCING_CHECK_EVERY)
            executor, client = self._executor, self._client
            if executor is None or client is None:
                continue
            if watch is None or watch.nc is not client.nc:
                watch = SourcingWatch(client.nc)
            names = {n for r in list(executor.fragments.values()) for n in r.runner.sourced}
            try:
                await watch.check(sorted(names))
            except Exception:
                log.exception("sourcing watch failed")

    async def _stream_usage(self, js: JetStreamContext) -> list[StreamUsage]:
        wanted = dict(self._hosted)
        executor = self._executor
        for running in list(executor.fragments.values()) if executor else []:
            for name in running.runner.streams:
                wanted.setdefault(name, self.retention.warn_at)

        async def look(name: str, warn_at: float) -> StreamUsage | None:
            try:
                async with asyncio.timeout(USAGE_TIMEOUT):
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

    def _drain_changes(self, timeout: float) -> None:
        try:
            key, value = self._changes.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            fid = key.partition(".")[2]
            if value is None:
                self._desired.pop(fid, None)
            else:
                self._desired[fid] = value
            try:
                key, value = self._changes.get_nowait()
            except queue.Empty:
                return

    def _reconcile(self) -> None:
        """Make what runs match what is assigned: :func:`reconcile` decides, this
        carries its actions out and reports each."""
        ex = self._executor
        assert ex is not None
        running = {fid: f.assignment.epoch for fid, f in ex.fragments.items()}
        actions = reconcile(
            self._desired,
            running,
            self._failed,
            self._savepointed,
            set(self._runtime),
            time.monotonic(),
        )
        for action in actions:
            if isinstance(action, Stop):
                stopped = ex.fragments[action.fragment_id].assignment
                ex.stop(action.fragment_id)
                self._report("stopped", self._stopped_runtime(stopped))
                self._runtime.pop(action.fragment_id, None)
            elif isinstance(action, Forget):
                self._runtime.pop(action.fragment_id, None)
            elif isinstance(action, Savepoint):
                a = action.assignment
                path = ex.savepoint(a)
                self._savepointed.add(savepoint_marker(a))
                rt = self._stopped_runtime(a)
                self._runtime[a.fragment.id] = rt
                self._report("savepointed", rt, savepoint_dir=path)
            else:
                self._start(action.assignment)

    def _start(self, a: Assignment) -> None:
        ex = self._executor
        assert ex is not None
        fid = a.fragment.id
        self._runtime[fid] = FragmentRuntime(fragment_id=fid, epoch=a.epoch, status="starting")
        try:
            ex.start(a)
        except (SpanflowError, FileNotFoundError) as exc:  # the fragment itself is wrong
            self._fail(a, exc, fatal=True)
            return
        except Exception as exc:  # e.g. the broker is briefly unreachable: retry
            self._fail(a, exc, fatal=False)
            return
        self._failed.pop(fid, None)
        rt = ex.runtime(fid)
        self._runtime[fid] = rt
        self._report("started", rt)

    def _fail(self, a: Assignment, exc: BaseException, *, fatal: bool) -> None:
        fid = a.fragment.id
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        log.error(
            "fragment %s failed to start%s: %s", fid, "" if fatal else " (will retry)", message
        )
        self._failed[fid] = Failure(a.epoch, time.monotonic(), fatal)
        rt = FragmentRuntime(
            fragment_id=fid, epoch=a.epoch, status="failed" if fatal else "failing", error=message
        )
        self._runtime[fid] = rt
        self._report("failed" if fatal else "progress", rt)

    def _stopped_runtime(self, a: Assignment) -> FragmentRuntime:
        return FragmentRuntime(
            fragment_id=a.fragment.id, epoch=a.epoch, status="stopped", error=None
        )

    def _observe(self) -> None:
        ex = self._executor
        assert ex is not None
        for fid in list(ex.fragments):
            try:
                self._runtime[fid] = ex.runtime(fid)
            except Exception as exc:  # observation must never stop the agent
                log.warning("cannot read progress of %s: %s", fid, exc)
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            for fid in ex.fragments:
                if fid in self._runtime:
                    self._report("progress", self._runtime[fid])

    def _report(
        self,
        event: ActivityEvent,
        rt: FragmentRuntime,
        savepoint_dir: str | None = None,
        detail: str | None = None,
    ) -> None:
        client = self._client
        if client is None:
            return
        act = Activity(
            node=self.settings.name,
            agent_id=self.agent_id,
            event=event,
            runtime=rt,
            savepoint_dir=savepoint_dir,
            detail=detail,
        )
        subject = activity_subject(self.settings.name, rt.fragment_id, event)
        try:
            control = self._control_js
            assert control is not None
            client.run(
                lambda: control.publish(
                    subject, act.model_dump_json().encode(), stream=ACTIVITY_STREAM
                ),
                # cut off from the control plane: do not hold the main loop for long
                timeout=10 if self._kv is not None else 2,
            )
        except Exception as exc:
            log.warning("activity report %s for %s not sent: %s", event, rt.fragment_id, exc)


class SparkWarmUp:
    """A SparkSession built on a background thread while the agent does other work."""

    def __init__(self, master: str, app_name: str, conf: dict[str, str] | None) -> None:
        self.master = master
        self._session: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._build, args=(app_name, conf), name="spark-warm-up", daemon=True
        )
        self._thread.start()

    def _build(self, app_name: str, conf: dict[str, str] | None) -> None:
        from spanflow.spark.session import build_session

        try:
            self._session = build_session(master=self.master, app_name=app_name, conf=conf)
        except BaseException as exc:  # raised again by session()
            self._error = exc

    def session(self) -> Any:
        """The session, once built (its error, if building it failed)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._session

    def discard(self) -> None:
        """Stop the session once built (it is not the one the node needs)."""
        self._thread.join()
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._session.stop()


def _detail(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail")
    except ValueError:
        return r.text[:300]
    return str(detail)


def _keyring_file() -> Path | None:
    """The gossip keyring of this process's secrets (locked mode), else None (plain)."""
    found = secrets_from_env()
    return found.keyring_file if found is not None else None
