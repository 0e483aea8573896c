"""The node agent: registers with the coordinator, then runs whatever its assignments say.

A thin shell over its rooms, as the coordinator is over control/: ``control_link``
registers (again, after a cut) and asks to shed; ``assignments`` watches this node's
keys in the assignments bucket (the coordinator may restart without any query
stopping); ``last_known`` keeps what an edge node needs to restart alone;
``fragments`` carries out what ``reconcile`` decides; ``reports`` sends heartbeats,
activity, load and usage; ``spark_host`` builds the node's SparkSession.

Threads: NATS runs on a private event-loop thread (heartbeats and the KV watch go on
while Spark starts a query); Spark is driven from the main thread only. Periods and
time-outs are in :class:`AgentTimings`; time comes from the agent's ``Clock``.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from spanflow.clock import Clock, SystemClock
from spanflow.nats.cluster import ensure_kv
from spanflow.nats.server import default_data_dir
from spanflow.nats.streams import SyncNats
from spanflow.protocol.rest import Registered, Registration
from spanflow.runtime.agent_settings import AgentSettings as AgentSettings
from spanflow.runtime.agent_settings import AgentTimings as AgentTimings
from spanflow.runtime.agent_settings import detect_capabilities as detect_capabilities
from spanflow.runtime.assignments import AssignmentWatch
from spanflow.runtime.control_link import AgentError as AgentError
from spanflow.runtime.control_link import ControlLink
from spanflow.runtime.executor import FragmentExecutor
from spanflow.runtime.fragments import LocalFragments
from spanflow.runtime.gossip import AgentGossip
from spanflow.runtime.last_known import LAST_ASSIGNMENTS_BUCKET, RegistrationCache
from spanflow.runtime.liveness import Liveness
from spanflow.runtime.reports import Reports
from spanflow.runtime.scaling.autoscaler import start_autoscaler
from spanflow.runtime.shedding.policy import Shedder
from spanflow.runtime.spark_host import SparkHost, keep_python_workers_warm, rehearse_when_idle
from spanflow.security.environment import own_node_token, secrets_from_env
from spanflow.spec.cluster import NodeRecord
from spanflow.spec.retention import Retention

log = logging.getLogger(__name__)


class NodeAgent:
    reports: Reports

    def __init__(self, settings: AgentSettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.agent_id = uuid.uuid4().hex[:12]
        self.nats_url = ""
        self.control_domain: str | None = None
        """JetStream domain of the control plane (KV, activity log) when this node's
        site has its own server; None when both are the cluster's server."""
        self.site_domain: str | None = None
        directory = settings.state_dir or default_data_dir() / "agents"
        self.link = ControlLink(settings, RegistrationCache(directory, settings.name), self.clock)
        self.liveness = Liveness(directory / f"{settings.name}.alive")
        """Renewed each turn of the main loop: a container's health check (docs/deploy.md)."""
        self.watch = AssignmentWatch(settings.name)
        self.fragments = LocalFragments(self._report, self.clock, settings.timings.progress_every)
        self.shedder = Shedder(settings.shedding)
        offered = settings.capabilities or detect_capabilities()
        self.reports = Reports(
            settings.name,
            self.agent_id,
            self.fragments,
            self.link,
            self.shedder,
            offered,
            self.clock,
        )
        self.reports.cut_off = lambda: self.watch.kv is None
        self.reports.token = own_node_token(settings.name)
        self.spark = SparkHost(settings)
        self.gossip = self._gossip() if settings.gossip else None
        self.reports.gossip = self.gossip

    def _report(self, *args: Any, **kwargs: Any) -> None:
        """The fragments' activity, reported (``self.reports`` is made after them)."""
        self.reports.report(*args, **kwargs)

    def _gossip(self) -> AgentGossip:
        s = self.settings
        return AgentGossip(
            s.name,
            bind=s.gossip_bind,
            port=s.gossip_port,
            advertise=s.gossip_advertise,
            on_verdict=self.reports.beat_soon,
            connected=self.reports.data_path_up,
            keyring_file=_keyring_file(),
        )

    @property
    def offline(self) -> bool:
        """Started from the saved registration; not registered with a coordinator yet."""
        return self.link.offline

    @property
    def retention(self) -> Retention:
        """Limits of the streams this node creates: its site's (from the topology)."""
        return self.reports.retention

    @property
    def ready(self) -> threading.Event:
        """Set once the node's Spark session runs its fragments."""
        return self.reports.ready

    # -- registration ----------------------------------------------------------------
    def register(self, *, once: bool = False) -> Registered | None:
        """Register (see :meth:`ControlLink.register`) and take on what the answer says."""
        s = self.settings
        if self.gossip is not None and self.reports.gossip_addr is None:
            self.reports.gossip_addr = self.gossip.bind()
        body = Registration(
            name=s.name,
            site=s.site,
            agent_id=self.agent_id,
            host=socket.gethostname(),
            gossip=self.reports.gossip_addr,
            capabilities=s.capabilities,
            detected=detect_capabilities(),
        ).model_dump(mode="json", exclude_none=True)
        answer = self.link.register(body, once=once)
        if answer is not None:
            self._apply(answer)
        return answer

    def _apply(self, answer: Registered) -> None:
        self.nats_url = self.settings.nats_url or answer.nats_url
        self.control_domain = answer.control_domain
        self.site_domain = answer.site_domain
        reports = self.reports
        if answer.retention is not None:
            reports.retention = answer.retention
        reports.interval = answer.heartbeat_interval
        reports.offered = answer.node.spec.capabilities
        reports.node_cpu.cores = reports.offered.cores
        if self.gossip is not None:
            profile = self.settings.gossip_profile or answer.gossip_profile or "lan"
            self.gossip.start(profile, list(answer.gossip_peers))

    # -- main loop -------------------------------------------------------------------
    def run(self, stop: threading.Event, after_spark: Callable[[], None] | None = None) -> None:
        """Register, start Spark, then run assignments until ``stop`` is set.

        ``after_spark`` runs once the SparkSession exists (PySpark replaces the process's
        SIGINT handler when it starts; the CLI puts its own back there)."""
        self.spark.warm_up(self.link.cache.load())
        try:
            answer = self.register()
        except BaseException:
            self.spark.discard()
            raise
        assert answer is not None
        log.info(
            "node %s %s (agent %s); NATS %s",
            self.settings.name,
            "starting from its saved registration" if self.offline else "registered",
            self.agent_id,
            self.nats_url,
        )
        client = self.reports.client = SyncNats(self.nats_url)
        self.reports.control = client.nc.jetstream(domain=self.control_domain)
        self._start_reaching(client, answer.node)
        client.run(self.reports.start)
        if self.offline or self.watch.kv is None:
            rejoin = partial(self.link.rejoin, stop, partial(self.register, once=True))
            threading.Thread(
                target=rejoin, args=(self._reach_control,), name="rejoin", daemon=True
            ).start()
        caps = answer.node.spec.capabilities
        spark = self.spark.session(caps)
        keep_python_workers_warm(spark, caps.cores, stop)
        rehearse_when_idle(spark, lambda: not self.fragments.desired, stop)
        if after_spark is not None:
            after_spark()
        executor = self.fragments.executor = FragmentExecutor(
            spark,
            self.nats_url,
            domain=self.site_domain,
            batch_offset=self.settings.batch_offset,
            retention=self.retention,
            node=self.settings.name,
            proofs=self.watch.proofs,
        )
        autoscaler = start_autoscaler(
            self.settings.scaling, spark, self.clock, self.link.report_scaled
        )
        self.ready.set()
        try:
            while not stop.is_set():
                self.liveness.beat()
                self.watch.drain(self.fragments.desired, timeout=self.reports.interval / 2)
                self.fragments.reconcile()
                executor.supervise()
                self.fragments.observe()
                if autoscaler is not None:
                    autoscaler.tick([f.load for f in self.fragments.running() if f.load])
        finally:
            executor.stop_all()
            if self.gossip is not None:
                self.gossip.close(leave=True)
            client.close()

    def _start_reaching(self, client: SyncNats, node: NodeRecord) -> None:
        """The site's copy of the assignments, the streams born here, then the control
        plane's assignments — or, cut off from them, the last-known ones."""
        if self.site_domain is not None:
            site = client.nc.jetstream(domain=self.site_domain)
            replicas = self.retention.replicas
            self.watch.last_known.kv = client.run(
                lambda: ensure_kv(site, LAST_ASSIGNMENTS_BUCKET, replicas=replicas)
            )
        self.reports.ensure_hosted_streams(client, node)
        if self._connect_control():
            return
        if self.watch.last_known.kv is None:
            raise AgentError(f"the control plane at {self.nats_url} is unreachable")
        self.fragments.desired = client.run(self.watch.last_known.load)
        log.warning(
            "control plane unreachable: running the %d last-known assignment(s) of %s "
            "from site %s; reconciling when it returns",
            len(self.fragments.desired),
            self.settings.name,
            self.site_domain,
        )

    def _connect_control(self) -> bool:
        """Watch this node's assignments; False while the control plane is out of reach.
        Less patience when the node has something to run without it (its site's copy of
        its last-known assignments): the rejoin keeps trying while those run."""
        client, control, t = self.reports.client, self.reports.control, self.settings.timings
        assert client is not None and control is not None
        fallback = self.offline or self.watch.last_known.kv is not None
        patience = t.control_patience_offline if fallback else t.control_patience
        return self.watch.connect(client, control, patience)

    def _reach_control(self) -> bool:
        """For the rejoin: whether the control plane's assignments are watched (now)."""
        if self.watch.kv is None and self._connect_control():
            log.info("control plane reachable again: reconciling with its assignments")
        return self.watch.kv is not None


def _keyring_file() -> Path | None:
    """The gossip keyring of this process's secrets (locked mode), else None (plain)."""
    found = secrets_from_env()
    return found.keyring_file if found is not None else None
