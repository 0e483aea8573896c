"""A whole spanflow cluster on this machine, as processes: a hub NATS server (three
with ``ha``), coordinator replicas, one agent per local node and, with
``site_servers``, each edge site's own NATS server and MQTT gateway behind a WAN relay
that can add delay and cut the link. ``spanflow up``, the cluster demo, the tests and
the benchmarks all run this one class."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from spanflow.errors import SpanflowError
from spanflow.local.api import Api
from spanflow.spec.cluster import NodeState

DEFAULT_PORT = 7070
"""The coordinator's REST port unless told otherwise."""


class LocalCluster:
    """A hub NATS server, a coordinator process and one process per local node; with
    ``site_servers``, every edge site also gets its own NATS server (JetStream domain =
    the site's name) linked to the hub as a leaf node through a :class:`WanRelay`,
    which can add delay and cut the uplink."""

    HUB_DOMAIN = "hub"

    def __init__(
        self,
        topology_path: Path,
        data_dir: Path,
        *,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        heartbeat: float = 1.0,
        site_servers: bool = False,
        wan_delay: float = 0.0,
        ha: bool = False,
        failure_after: int = 3,
        gossip_profile: str = "lan",
        node_args: list[str] | None = None,
        coordinator_args: list[str] | None = None,
        secure: bool = False,
    ) -> None:
        from spanflow.api.topology_loader import load_topology
        from spanflow.security.secrets import Secrets

        if ha and site_servers:
            raise SpanflowError(
                "--ha runs the hub as a three-server NATS cluster; give edge sites their own "
                "servers without it (--shared-server with --ha)"
            )

        self.topology_path = topology_path
        self.topology = load_topology(topology_path)
        self.data_dir = data_dir
        self.port = port
        self.token = token
        self.heartbeat = heartbeat
        self.site_servers = site_servers
        self.wan_delay = wan_delay
        self.ha = ha
        self.failure_after = failure_after
        self.gossip_profile = gossip_profile
        self.node_args = list(node_args or [])
        """Extra ``spanflow node`` options for every local agent (e.g. shedding)."""
        self.coordinator_args = list(coordinator_args or [])
        """Extra ``spanflow coordinator`` options (e.g. ``--no-rebalance``)."""
        self.coordinators = (
            ["coordinator-1", "coordinator-2", "coordinator-3"] if ha else ["coordinator"]
        )
        """Process names of the coordinator replicas (three with ``ha``)."""
        self.coordinator_urls: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.site_urls: dict[str, str] = {}
        """Edge site → its own NATS server's URL (with ``site_servers``)."""
        self.relays: dict[str, Any] = {}
        """Edge site → the :class:`WanRelay` between its server and the hub."""
        self.site_mqtt: dict[str, Any] = {}
        """Edge site → its MQTT gateway (devices publish here; a PUBACK means stored)."""
        self._nats: Any = None
        self._site_nats: dict[str, Any] = {}
        self.secrets = Secrets(data_dir / "secrets") if secure else None
        """Locked mode: every server requires TLS and a role's credentials, gossip is
        sealed, the REST API requires the token (docs/security.md)."""
        if self.secrets is not None:
            self.secrets.init()
            self.token = token or self.secrets.credentials().rest_token

    def start(self) -> LocalCluster:
        from spanflow.nats import EmbeddedNats
        from spanflow.nats.server import NatsCluster

        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        edges = self._edge_sites() if self.site_servers else []
        if self.ha:
            self._nats = NatsCluster(
                self.data_dir / "nats-cluster", 3, name="hub", secrets=self.secrets
            ).start()
        else:
            self._nats = EmbeddedNats(
                self.data_dir / "nats",
                name="hub",
                domain=self.HUB_DOMAIN if edges else None,
                leaf_listen=bool(edges),
                secrets=self.secrets,
            ).start()
        self.nats_url = self._nats.url
        self._topology_for_coordinator = self.topology_path
        if edges:
            self._start_site_servers(edges)
            self._topology_for_coordinator = self.data_dir / "topology.effective.json"
            self._topology_for_coordinator.write_text(self._effective_topology())
        self.start_coordinators(self.coordinators)
        self._wait_leader(time.monotonic() + 60)
        for n in self.topology.nodes:
            if n.local:
                self.start_node(n.name)
        return self

    @property
    def url(self) -> str:
        """Every coordinator's URL, comma-separated (what ``--coordinator`` takes)."""
        return ",".join(self.coordinator_urls[n] for n in self.coordinators)

    def _coordinator_port(self, name: str, index: int) -> int:
        """A restarted replica keeps its port: clients hold the list of URLs."""
        if name in self.coordinator_urls:
            return int(self.coordinator_urls[name].rsplit(":", 1)[1])
        return self.port + index if self.port else 0

    def _coordinator_args(self, name: str) -> list[str]:
        index = self.coordinators.index(name)
        args = [
            "coordinator",
            "--nats",
            self.nats_url,
            "--topology",
            str(self._topology_for_coordinator),
            "--port",
            str(self._coordinator_port(name, index)),
            "--port-file",
            str(self._port_file(name)),
            "--data-dir",
            str(self.data_dir),
            "--heartbeat",
            str(self.heartbeat),
            "--name",
            name,
            "--failure-after",
            str(self.failure_after),
            "--gossip-profile",
            self.gossip_profile,
            *self.coordinator_args,
        ]
        if self.ha:
            args += ["--replicas", "3"]
        if self.site_urls:
            args += ["--hub-domain", self.HUB_DOMAIN]
        return args

    def _edge_sites(self) -> list[str]:
        """Sites with local nodes, other than the cloud site that hosts the hub."""
        from spanflow.spec.topology import SiteKind

        local_sites = {n.site for n in self.topology.nodes if n.local}
        return [
            s.name
            for s in self.topology.sites
            if s.kind == SiteKind.EDGE and s.name in local_sites and not s.nats_url
        ]

    def _start_site_servers(self, sites: list[str]) -> None:
        from spanflow.doors.mqtt_gateway import GatewayThread
        from spanflow.nats import EmbeddedNats
        from spanflow.nats.cluster import EDGE_ONLY_SUBJECTS
        from spanflow.nats.relay import WanRelay

        hub_leaf = urlparse(self._nats.leaf_url)
        for site in sites:
            relay = WanRelay(hub_leaf.hostname or "127.0.0.1", hub_leaf.port or 0)
            relay.delay = self.wan_delay
            self.relays[site] = relay.start()
            # Data born here stays here unless a pipeline sends it (by stream sourcing).
            born_here = tuple(
                subject
                for n in self.topology.nodes
                if n.site == site
                for stream in n.streams
                for subject in stream.subjects
            )
            server = EmbeddedNats(
                self.data_dir / f"nats-{site}",
                name=site,
                domain=site,
                leaf_remote=relay.url,
                deny_exports=(*EDGE_ONLY_SUBJECTS, *born_here),
                secrets=self.secrets,
            ).start()
            self._site_nats[site] = server
            self.site_urls[site] = server.url
            gateway = GatewayThread(server.url, "127.0.0.1", 0, secrets=self.secrets)
            self.site_mqtt[site] = gateway.start()

    def _effective_topology(self) -> str:
        """The topology file as the coordinator must see it: each edge site's server URL."""
        sites = [
            s.model_copy(update={"nats_url": self.site_urls[s.name]})
            if s.name in self.site_urls
            else s
            for s in self.topology.sites
        ]
        return self.topology.model_copy(update={"sites": tuple(sites)}).model_dump_json(
            by_alias=True, exclude_none=True
        )

    def _port_file(self, name: str) -> Path:
        return self.data_dir / f"{name}.port"

    def start_coordinator(self, name: str | None = None) -> None:
        """Start (or restart) a coordinator process and wait until it answers."""
        self.start_coordinators([name or self.coordinators[0]])

    def start_coordinators(self, names: list[str]) -> None:
        """Start replicas at the same instant, as a real deployment would, then wait
        until each answers."""
        for name in names:
            self._port_file(name).unlink(missing_ok=True)
            self._spawn(name, self._coordinator_args(name))
        deadline = time.monotonic() + 60
        for name in names:
            self._wait_coordinator(name, deadline)

    def _wait_coordinator(self, name: str, deadline: float) -> None:
        port_file = self._port_file(name)
        while not port_file.exists() or not port_file.read_text().strip():
            self._check_alive(name)
            if time.monotonic() > deadline:
                raise SpanflowError(f"{name} did not start within 60 s")
            time.sleep(0.1)
        self.coordinator_urls[name] = f"http://127.0.0.1:{port_file.read_text().strip()}"
        self._wait_healthy(name, deadline)

    def _wait_leader(self, deadline: float) -> None:
        """Until one replica leads and every replica has the topology it merged (a
        standby answering reads sees the declared nodes)."""
        while self.leader() is None or any(
            not self._has_topology(name) for name in self.coordinators
        ):
            if time.monotonic() > deadline:
                raise SpanflowError("no coordinator took office within 60 s")
            time.sleep(0.2)

    def _has_topology(self, name: str) -> bool:
        want = {n.name for n in self.topology.nodes}
        try:
            nodes = Api(self.coordinator_urls[name], self.token, patience=0).typed(
                lambda c: c.nodes()
            )
        except SpanflowError:
            return False
        return want <= {n.name for n in nodes}

    def leader(self) -> str | None:
        """The coordinator process that leads now (None during an election)."""
        for name in self.coordinators:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:
                health = httpx.get(f"{self.coordinator_urls[name]}/healthz", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                continue
            if health.get("role") == "leader":
                return name
        return None

    def check_coordinators(self) -> None:
        """Raise when no coordinator process is left running."""
        if all(self.procs[n].poll() is not None for n in self.coordinators if n in self.procs):
            self._check_alive(self.coordinators[0])

    def start_node(
        self, name: str, nats: str | None = None, coordinator: str | None = None
    ) -> None:
        """(Re)start one local node's agent process (``nats``: reach NATS there;
        ``coordinator``: reach the coordinators there, e.g. through a cuttable relay)."""
        spec = next(n for n in self.topology.nodes if n.name == name)
        # The local nodes share this machine's cores: spread their batch slots apart
        # over the first half of the interval (each node's own queries fill the rest).
        local = [n.name for n in self.topology.nodes if n.local or n.name == name]
        offset = local.index(name) / (2 * len(local))
        self._spawn(
            f"node-{name}",
            [
                "node",
                "--name",
                name,
                "--site",
                spec.site,
                "--coordinator",
                coordinator or self.url,
                "--batch-offset",
                f"{offset:.4f}",
                "--state-dir",
                str(self.data_dir / "agents"),
                *(["--nats", nats] if nats else []),
                *self.node_args,
            ],
        )

    def kill(self, name: str, sig: int = signal.SIGKILL, *, tree: bool = False) -> None:
        """Kill one process of the cluster (``coordinator`` or ``node-<name>``) and reap it.
        ``tree``: its children too, at once (an agent's Spark JVM, its Python workers), as
        a machine's death would; by itself the JVM notices its parent's end and shuts
        down, still running tasks for a moment."""
        import psutil

        proc = self.procs[name]
        family = psutil.Process(proc.pid).children(recursive=True) if tree else []
        proc.send_signal(sig)
        for child in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.send_signal(sig)
        proc.wait(timeout=60)

    def wait_for_nodes(self, timeout: float = 180.0) -> None:
        """Until every local node has registered (each starts its own Spark first)."""
        want = {n.name for n in self.topology.nodes if n.local}
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.api().typed(lambda c: c.nodes())
            alive = {n.name for n in nodes if n.state == NodeState.ALIVE}
            if want <= alive:
                return
            for name in want - alive:
                self._check_alive(f"node-{name}")
            if time.monotonic() > deadline:
                raise SpanflowError(
                    f"nodes did not register within {timeout:.0f} s: {sorted(want - alive)}"
                )
            time.sleep(0.5)

    def _spawn(self, name: str, args: list[str]) -> None:
        from spanflow.nats.server import die_with_parent
        from spanflow.security.secrets import ROLE_ENV, SECRETS_ENV

        env = dict(os.environ)
        if self.token:
            env["SPANFLOW_TOKEN"] = self.token
        env.pop(ROLE_ENV, None)  # each command takes its own role
        if self.secrets is not None:
            env[SECRETS_ENV] = str(self.secrets.root.resolve())
        log = open(self.data_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (child owns it)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "spanflow.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,
        )
        log.close()

    def _check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = (self.data_dir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
            raise SpanflowError(f"{name} exited with {proc.returncode}:\n{tail}")

    def _wait_healthy(self, name: str, deadline: float) -> None:
        while True:
            self._check_alive(name)
            try:
                url = self.coordinator_urls[name]
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SpanflowError(f"{name} did not answer within 60 s")
            time.sleep(0.2)

    def api(self) -> Api:
        return Api(self.url, self.token)

    def stop(self) -> None:
        """SIGTERM every child, wait, then SIGKILL what is left: no orphans."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for gateway in self.site_mqtt.values():
            gateway.stop()
        self.site_mqtt.clear()
        for server in self._site_nats.values():
            server.stop()
        self._site_nats.clear()
        for relay in self.relays.values():
            relay.stop()
        if self._nats is not None:
            self._nats.stop()
            self._nats = None
