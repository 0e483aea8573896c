"""Cluster commands: coordinator, node, up, and the client commands that talk to the
coordinator's REST API (submit, status, cancel, savepoint, resume, drain)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import urlparse

import httpx
import typer
from pydantic import ValidationError
from rich.console import Group
from rich.live import Live
from rich.table import Table

from spanflow.cli.common import (
    _data_dir,
    _Interrupted,
    _quiet_spark,
    app,
    console,
    err,
    fail,
    local_rest_token,
    use_secrets,
)
from spanflow.errors import SpanflowError
from spanflow.protocol.rest import ClusterMetrics, NodeStatus, PipelineStatus, SubmitBody
from spanflow.security.https import client_context, require_tls, scheme, server_files, wants_tls
from spanflow.security.policy import require_token
from spanflow.spec.cluster import NodeState
from spanflow.spec.locations import resolve

if TYPE_CHECKING:
    from spanflow.protocol.client import CoordinatorClient

T = TypeVar("T")

DEFAULT_PORT = 7070

CoordinatorOption = Annotated[
    str,
    typer.Option(
        "--coordinator",
        envvar="SPANFLOW_COORDINATOR",
        help="Coordinator URL, or the URLs of all replicas comma-separated "
        "(env SPANFLOW_COORDINATOR).",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="SPANFLOW_TOKEN",
        help="Bearer token of the REST API (env SPANFLOW_TOKEN).",
        show_default=False,
    ),
]
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


def _logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("py4j", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# -- servers --------------------------------------------------------------------------
@app.command()
def coordinator(
    nats: Annotated[str | None, typer.Option(help="NATS URL; default: an embedded server.")] = None,
    topology: Annotated[
        Path | None, typer.Option(help="Topology file applied at start (sites, nodes, links).")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 = any free port).")] = DEFAULT_PORT,
    advertise: Annotated[
        str | None,
        typer.Option(
            help="URL other coordinators and clients reach this one at (behind NAT or when "
            "listening on 0.0.0.0), e.g. http://cloud-1.example.com:7070."
        ),
    ] = None,
    port_file: Annotated[
        Path | None, typer.Option(help="Write the port listened on to this file.")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Default ./spanflow-data.")] = None,
    state_dir: Annotated[
        str | None,
        typer.Option(
            help="Checkpoints and savepoints: a directory every node mounts, or a Hadoop "
            "URL (jetstream://<store>/<path> keeps them in the site's NATS; hdfs://, "
            "file://). Default: <data-dir>/cluster.",
        ),
    ] = None,
    heartbeat: Annotated[float, typer.Option(help="Heartbeat period in seconds.")] = 1.0,
    hub_domain: Annotated[
        str | None,
        typer.Option(help="JetStream domain of the NATS server (needed by sites with their own)."),
    ] = None,
    token: TokenOption = None,
    name: Annotated[
        str, typer.Option(help="Replica name, unique among the coordinators.")
    ] = "coordinator",
    replicas: Annotated[
        int | None,
        typer.Option(
            help="Copies of the control log and buckets "
            "[default: one per server of the NATS cluster, up to 3]."
        ),
    ] = None,
    lease: Annotated[
        float | None,
        typer.Option(
            help="Seconds a silent leader keeps the lease before a standby leads "
            "[default: 3 on one NATS server, 19 on a cluster: longer than its failover]."
        ),
    ] = None,
    failure_after: Annotated[
        int, typer.Option(help="Heartbeat periods of silence after which a node is failed.")
    ] = 3,
    gossip_profile: Annotated[
        str, typer.Option(help="Membership profile nodes use: lan, wan or local_test.")
    ] = "lan",
    rebalance: Annotated[
        bool, typer.Option(help="Move work off nodes overloaded for long (docs/balancing.md).")
    ] = True,
    public_reads: Annotated[
        bool,
        typer.Option(
            help="Let anyone who reaches the API read it (GET, the dashboard, /metrics) "
            "without the token; writes still need it."
        ),
    ] = False,
    tls: Annotated[
        bool | None,
        typer.Option(
            "--tls/--no-tls",
            help="Serve HTTPS with the deployment's certificate [default: when locked and "
            "listening beyond loopback; plain HTTP beyond loopback is refused].",
        ),
    ] = None,
) -> None:
    """Run a coordinator: REST API, dashboard (/ui), registry, pipeline manager, failure
    detection.

    Several coordinators on one NATS cluster (each with its own ``--name``) elect one
    leader; the others answer reads, redirect writes to it and take over if it dies."""
    import uvicorn

    from spanflow.api.topology_loader import load_topology
    from spanflow.cli.common import nats_url
    from spanflow.control.coordinator import Coordinator, CoordinatorSettings
    from spanflow.server.app import create_app

    _logging()
    try:
        topo = load_topology(topology) if topology else None
    except SpanflowError as exc:
        raise fail(exc) from None
    directory = _data_dir(data_dir)
    secrets = use_secrets(directory, "coordinator")
    creds = secrets.credentials() if secrets is not None else None
    if not token and creds is not None:
        token = creds.rest_token
    https = wants_tls(host, secrets, tls)
    try:
        require_token("REST API", host, token, "--token or `spanflow secrets init`")
        require_tls("REST API", host, https)
        certificate = server_files(secrets) if https else None
    except SpanflowError as exc:
        raise fail(exc) from None
    with nats_url(nats, directory) as url:
        settings = CoordinatorSettings(
            nats_url=url,
            state_dir=resolve(state_dir or directory / "cluster"),
            heartbeat_interval=heartbeat,
            hub_domain=hub_domain,
            token=token or None,
            node_token_key=creds.agent_key if creds is not None else None,
            topology=topo,
            name=name,
            replicas=replicas,
            lease_seconds=lease,
            failure_after=failure_after,
            gossip_profile=gossip_profile,
            rebalance=rebalance,
            public_reads=public_reads,
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise fail(SpanflowError(f"cannot listen on {host}:{port}: {exc.strerror}")) from None
        actual = sock.getsockname()[1]
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
        settings.url = advertise or f"{scheme(https)}://{shown}:{actual}"
        if port_file:
            port_file.write_text(str(actual))
        err.print(
            f"coordinator on {scheme(https)}://{host}:{actual} (dashboard /ui, API docs "
            f"/docs; token {_token_mode(settings.token, public_reads)})"
        )
        config = uvicorn.Config(
            create_app(Coordinator(settings)),
            log_level="warning",
            lifespan="on",
            ssl_certfile=certificate[0] if certificate else None,
            ssl_keyfile=certificate[1] if certificate else None,
        )
        uvicorn.Server(config).run(sockets=[sock])


def _token_mode(token: str | None, public_reads: bool) -> str:
    if not token:
        return "off"
    return "required for writes" if public_reads else "required"


@app.command()
def node(
    name: Annotated[str, typer.Option(help="Node name (unique in the cluster).")],
    site: Annotated[str, typer.Option(help="Site the node is in.")],
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
    cores: Annotated[int | None, typer.Option(help="Cores to offer (default: detected).")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory to offer, e.g. 4g.")] = None,
    slots: Annotated[
        int | None,
        typer.Option(
            help="Fragment slots: fragments at once, one more per Python stateful step "
            "(default: cores)."
        ),
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Capability tag (repeatable).")] = None,
    master: Annotated[
        str | None,
        typer.Option(
            help="Spark master (default local[cores]); spark://HOST:PORT runs the node's "
            "fragments on a Spark standalone cluster (`spanflow spark-cluster`), whose "
            "cores and memory the node then offers."
        ),
    ] = None,
    master_ui: Annotated[
        str | None,
        typer.Option(
            help="The Spark master's web UI, read for the cluster's capacity (default "
            "http://MASTER-HOST:8080)."
        ),
    ] = None,
    realtime_slots: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Spark task slots above the cores for Real-Time Mode queries (each holds "
            "1-2 for its whole batch; default 4; see docs/realtime.md).",
        ),
    ] = None,
    batch_offset: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.999,
            help="Shift of this node's micro-batch start slots, as a fraction of the trigger "
            "interval; give nodes that share a machine different ones.",
        ),
    ] = 0.0,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where the agent keeps its last registration, to start without the "
            "coordinator (default: spanflow's data dir)."
        ),
    ] = None,
    nats: Annotated[
        str | None,
        typer.Option(
            help="Reach NATS at this URL instead of the one the coordinator names "
            "(a proxy or another route to the same server)."
        ),
    ] = None,
    gossip: Annotated[
        bool, typer.Option(help="Run membership (SWIM gossip) with the partition's nodes.")
    ] = True,
    gossip_bind: Annotated[str, typer.Option(help="Address of the membership endpoint.")] = (
        "127.0.0.1"
    ),
    gossip_port: Annotated[
        int, typer.Option(help="UDP+TCP port of the membership endpoint (0: any free).")
    ] = 0,
    gossip_advertise: Annotated[
        str | None, typer.Option(help="Address peers reach the endpoint at (NAT, 0.0.0.0).")
    ] = None,
    gossip_profile: Annotated[
        str | None,
        typer.Option(help="lan, wan or local_test (default: the coordinator's choice)."),
    ] = None,
    shed: Annotated[
        bool, typer.Option(help="Ask a less-loaded peer to take a fragment when overloaded.")
    ] = True,
    shed_high: Annotated[
        float, typer.Option(help="Load score above which the node is overloaded.")
    ] = 0.9,
    shed_low: Annotated[
        float, typer.Option(help="A peer takes a fragment only if it stays below this.")
    ] = 0.6,
    shed_sustain: Annotated[float, typer.Option(help="Seconds overloaded before shedding.")] = 10.0,
    shed_cooldown: Annotated[float, typer.Option(help="Seconds between two shed requests.")] = 30.0,
) -> None:
    """Run a node agent: register (retrying for as long as it takes), heartbeat, run
    assigned fragments as Spark queries. A node that registered before starts from its
    saved registration and its site's last-known assignments when the coordinator
    cannot be reached."""
    from spanflow.runtime.agent import AgentSettings, NodeAgent, detect_capabilities
    from spanflow.runtime.shedding.policy import SheddingConfig
    from spanflow.spec.topology import Capabilities

    _logging()
    _quiet_spark()
    secrets = use_secrets(state_dir, "agent")
    if not token and secrets is not None:
        token = secrets.credentials().api_token(name)
    caps = None
    if master and master.startswith("spark://") and cores is None:
        cores, memory = _spark_cluster_offer(master, master_ui, memory)
    if any(v is not None for v in (cores, memory, slots, tag, realtime_slots)):
        detected = detect_capabilities()
        try:
            caps = Capabilities.model_validate(
                {
                    "cores": cores or detected.cores,
                    "memory_mb": memory or detected.memory_mb,
                    "slots": slots,
                    "tags": tuple(tag or ()),
                    "realtime_slots": detected.realtime_slots
                    if realtime_slots is None
                    else realtime_slots,
                }
            )
        except ValueError as exc:
            raise fail(SpanflowError(f"bad capability: {exc}")) from None
    settings = AgentSettings(
        name=name,
        site=site,
        coordinator_url=coordinator_url,
        token=token or None,
        capabilities=caps,
        master=master,
        batch_offset=batch_offset,
        state_dir=state_dir,
        nats_url=nats,
        gossip=gossip,
        gossip_bind=gossip_bind,
        gossip_port=gossip_port,
        gossip_advertise=gossip_advertise,
        gossip_profile=gossip_profile,
        shedding=SheddingConfig(
            enabled=shed, high=shed_high, low=shed_low, sustain=shed_sustain, cooldown=shed_cooldown
        ),
    )
    if shed_low >= shed_high:
        raise fail(SpanflowError("--shed-low must be below --shed-high (hysteresis)"))
    if gossip_profile is not None:
        from spanflow.runtime.membership.config import MembershipConfig

        try:
            MembershipConfig.named(gossip_profile)
        except ValueError as exc:
            raise fail(SpanflowError(str(exc))) from None
    stop = _Interrupted()
    try:
        NodeAgent(settings).run(stop.event, after_spark=stop.install)
    except SpanflowError as exc:
        raise fail(exc) from None


# -- the REST client ---------------------------------------------------------------------
class Api:
    """The coordinators' API for CLI commands: fails over along the URL list and waits
    out an election (a few seconds) before giving up."""

    def __init__(self, url: str, token: str | None, patience: float = 30.0) -> None:
        from spanflow.protocol.client import CoordinatorClient

        self.client = CoordinatorClient(
            url, token or local_rest_token(), patience=patience, verify=client_context()
        )

    @property
    def url(self) -> str:
        return self.client.url

    def typed(self, call: Callable[[CoordinatorClient], T]) -> T:
        """A typed call of the client (``lambda c: c.nodes()``); its failures as a
        SpanflowError that says what the coordinator answered."""
        from spanflow.protocol.client import ApiError, CoordinatorUnreachable

        try:
            return call(self.client)
        except CoordinatorUnreachable as exc:
            raise SpanflowError(f"no coordinator answered: {exc}") from None
        except ApiError as exc:
            raise SpanflowError(str(exc)) from None

    def view(self) -> Group:
        """The status view of nodes, pipelines and the cluster."""
        return self.typed(lambda c: cluster_view(c.nodes(), c.pipelines(), c.cluster_metrics()))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """An untyped call: the answer's JSON."""
        from spanflow.protocol.client import CoordinatorUnreachable

        try:
            r = self.client.request(method, path, body)
        except CoordinatorUnreachable as exc:
            raise SpanflowError(f"no coordinator answered: {exc}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail")
            except ValueError:
                detail = r.text
            if not isinstance(detail, str):
                detail = json.dumps(detail)
            raise SpanflowError(f"{r.status_code}: {detail}")
        return r.json() if r.content else None


@app.command()
def submit(
    pipeline: Annotated[Path, typer.Argument(help="PIPELINE.yaml or PIPELINE.json")],
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
    priority: Annotated[int, typer.Option(help="Higher is placed first (0-1000).")] = 0,
    latency_budget: Annotated[
        str | None, typer.Option(help="End-to-end latency budget, e.g. 2s.")
    ] = None,
    parallelism: Annotated[int, typer.Option(help="Desired parallelism.")] = 1,
) -> None:
    """Submit a pipeline to the coordinator."""
    try:
        text = pipeline.read_text()
    except OSError as exc:
        raise fail(SpanflowError(f"cannot read {pipeline}: {exc.strerror}")) from None
    from spanflow.spec.pipeline import format_validation_error

    try:
        json_spec = json.loads(text) if pipeline.suffix == ".json" else None
        body = SubmitBody.model_validate(
            {
                "yaml": None if json_spec is not None else text,
                "spec": json_spec,
                "filename": str(pipeline),
                "priority": priority,
                "latency_budget": latency_budget,
                "parallelism": parallelism,
            }
        )
    except ValidationError as exc:
        raise fail(SpanflowError(f"{pipeline}: {format_validation_error(exc)}")) from None
    except ValueError as exc:  # not JSON
        raise fail(SpanflowError(f"{pipeline}: {exc}")) from None
    try:
        status = Api(coordinator_url, token).typed(lambda c: c.submit(body))
    except SpanflowError as exc:
        raise fail(exc) from None
    placed = ", ".join(f"{f.id} → {f.node or 'waiting'}" for f in status.fragments)
    console.print(f"submitted [bold]{status.name}[/bold]: {status.state.value} ({placed})")


@app.command()
def status(
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show every node and pipeline."""
    api = Api(coordinator_url, token)
    try:
        nodes = api.typed(lambda c: c.nodes())
        pipelines = api.typed(lambda c: c.pipelines())
        metrics = api.typed(lambda c: c.cluster_metrics())
    except SpanflowError as exc:
        raise fail(exc) from None
    if as_json:
        console.print_json(
            data={
                "nodes": [n.model_dump(mode="json", by_alias=True) for n in nodes],
                "pipelines": [p.model_dump(mode="json") for p in pipelines],
                "cluster": metrics.model_dump(mode="json"),
            }
        )
        return
    console.print(cluster_view(nodes, pipelines, metrics))


def cluster_view(
    nodes: list[NodeStatus], pipelines: list[PipelineStatus], metrics: ClusterMetrics
) -> Group:
    colour = {"alive": "green", "failed": "red", "draining": "yellow", "declared": "dim"}
    nt = Table(title="nodes")
    widest = max((len(n.name) for n in nodes), default=4)
    nt.add_column("node", no_wrap=True, min_width=widest)
    for col in ("site", "state", "slots", "cpu %", "fragments", "heartbeat"):
        nt.add_column(col)
    for n in nodes:
        beat = n.last_heartbeat_s
        state = n.state.value
        nt.add_row(
            n.name,
            n.spec.site,
            f"[{colour.get(state, 'white')}]{state}[/]",
            f"{len(n.fragments)}/{n.slots}",
            "-" if n.cpu_percent is None else f"{n.cpu_percent:.0f}",
            ", ".join(n.fragments) or "-",
            "-" if beat is None else f"{beat:.1f} s ago",
        )
    pcolour = {"running": "green", "failing": "red", "failed": "red", "planned": "yellow"}
    pt = Table(title="pipelines")
    widest = max((len(p.name) for p in pipelines), default=8)
    pt.add_column("pipeline", no_wrap=True, min_width=widest)
    pt.add_column("state", no_wrap=True, min_width=8)
    for col in ("fragments", "rows in", "rows/s", "lag", "dead", "reason"):
        pt.add_column(col)
    for p in pipelines:
        rts = [f.runtime for f in p.fragments if f.runtime is not None]
        state = p.state.value
        pt.add_row(
            p.name,
            f"[{pcolour.get(state, 'white')}]{state}[/]",
            ", ".join(f"{f.id}@{f.node or '-'}:{f.status}" for f in p.fragments),
            f"{sum(r.rows_in for r in rts):,}",
            f"{sum(r.input_rows_per_s + r.realtime_rows_per_s for r in rts):,.0f}",
            f"{sum(r.lag for r in rts):,}",
            f"{sum(r.dead_letters for r in rts):,}",
            p.reason[:60],
        )
    summary = (
        f"slots {metrics.slots_used}/{metrics.slots} used "
        f"({metrics.utilisation:.0%}), cpu {metrics.cpu_percent:.0f}%, "
        f"throughput {metrics.throughput_rows_per_s:,.0f} rows/s"
    )
    warnings = [f"[yellow]⚠ {n.name}: {w}[/]" for n in nodes for w in n.warnings]
    return Group(nt, pt, summary, *warnings)


def _pipeline_action(action: str, name: str, url: str, token: str | None) -> None:
    try:
        st = Api(url, token).typed(lambda c: c.pipeline_action(name, action))
    except SpanflowError as exc:
        raise fail(exc) from None
    extra = f" savepoint {st.savepoint}" if action == "savepoint" else ""
    console.print(f"{name}: {st.state.value}{extra}")


@app.command()
def cancel(
    name: Annotated[str, typer.Argument(help="Pipeline name.")],
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Cancel a pipeline: its queries stop and its fragments are unassigned."""
    _pipeline_action("cancel", name, coordinator_url, token)


@app.command()
def savepoint(
    name: Annotated[str, typer.Argument(help="Pipeline name.")],
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Stop a pipeline at a consistent checkpoint and keep a copy of it."""
    _pipeline_action("savepoint", name, coordinator_url, token)


@app.command()
def resume(
    name: Annotated[str, typer.Argument(help="Pipeline name.")],
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Restart a stopped pipeline from its savepoint."""
    _pipeline_action("resume", name, coordinator_url, token)


@app.command()
def drain(
    name: Annotated[str, typer.Argument(help="Node name.")],
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Move a node's fragments elsewhere and give it no new ones."""
    try:
        st = Api(coordinator_url, token).typed(lambda c: c.drain(name))
    except SpanflowError as exc:
        raise fail(exc) from None
    console.print(f"{name}: {st.state.value}")


# -- one machine, whole cluster ----------------------------------------------------------
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

    def start_node(self, name: str, nats: str | None = None) -> None:
        """(Re)start one local node's agent process (``nats``: reach NATS there)."""
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
                self.url,
                "--batch-offset",
                f"{offset:.4f}",
                "--state-dir",
                str(self.data_dir / "agents"),
                *(["--nats", nats] if nats else []),
                *self.node_args,
            ],
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one process of the cluster (``coordinator`` or ``node-<name>``) and reap it."""
        proc = self.procs[name]
        proc.send_signal(sig)
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


@app.command()
def up(
    topology: Annotated[
        Path, typer.Argument(help="Topology file (nodes marked local: true run here).")
    ],
    data_dir: Annotated[Path | None, typer.Option(help="Default ./spanflow-data.")] = None,
    port: Annotated[int, typer.Option(help="Coordinator port (0 = any).")] = DEFAULT_PORT,
    submit_: Annotated[
        list[Path] | None, typer.Option("--submit", help="Pipeline to submit once up (repeatable).")
    ] = None,
    duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    site_servers: Annotated[
        bool,
        typer.Option(
            "--site-servers/--shared-server",
            help="Give every edge site its own NATS server (a leaf node of the hub), or run "
            "all sites on one.",
        ),
    ] = True,
    wan_delay: Annotated[
        str,
        typer.Option(help="One-way delay added between each edge server and the hub, e.g. 30ms."),
    ] = "0s",
    token: TokenOption = None,
    ha: Annotated[
        bool,
        typer.Option(
            "--ha",
            help="High availability: a three-server NATS cluster (control log and buckets "
            "replicated three times) and three coordinators electing a leader.",
        ),
    ] = False,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure/--open",
            help="Lock every door (the default): TLS and role credentials on NATS, sealed "
            "gossip, the REST token, with secrets made in <data dir>/secrets if missing; "
            "--open runs without them (docs/security.md).",
        ),
    ] = True,
) -> None:
    """Start NATS, the coordinator and every local node of a topology, with one status view.

    Each edge site gets its own NATS server, linked to the hub's as a leaf node through
    a relay on this machine (``--wan-delay`` emulates the distance)."""
    from spanflow.spec.durations import parse_duration

    stop = _Interrupted()
    directory = _data_dir(data_dir)
    try:
        delay = parse_duration(wan_delay)
    except ValueError as exc:
        raise fail(SpanflowError(f"--wan-delay: {exc}")) from None
    try:
        cluster = LocalCluster(
            topology,
            directory,
            port=port,
            token=token or None,
            site_servers=site_servers and not ha,
            wan_delay=delay,
            ha=ha,
            secure=secure,
        )
    except SpanflowError as exc:
        raise fail(exc) from None
    if cluster.secrets is None:
        err.print(
            "[yellow]OPEN MODE: NATS without TLS or users, gossip unsealed; anyone who "
            "reaches these ports can read and write everything (--secure locks them)[/yellow]"
        )
    else:
        err.print(
            f"locked: secrets in {cluster.secrets.root} (other commands find them with "
            f"--data-dir {directory} or SPANFLOW_SECRETS={cluster.secrets.root})"
        )
    try:
        local = sum(n.local for n in cluster.topology.nodes)
        what = "three NATS servers, three coordinators" if ha else "NATS, the coordinator"
        err.print(f"starting {what} and {local} nodes (logs in {directory / 'logs'}) …")
        cluster.start()
        err.print(f"coordinator: {cluster.url}   (export SPANFLOW_COORDINATOR={cluster.url})")
        if ha:
            err.print(f"NATS cluster: {cluster.nats_url}; leader: {cluster.leader()}")
        for site, url in cluster.site_urls.items():
            mqtt = cluster.site_mqtt[site]
            err.print(
                f"site {site}: NATS {url} (JetStream domain {site}), MQTT {mqtt.host}:{mqtt.port}"
            )
        if submit_:
            cluster.wait_for_nodes()
        for path in submit_ or []:
            st = _submit_file(cluster.api(), path)
            err.print(f"submitted {st.name}: {st.state.value}")
        _watch(cluster, stop, duration)
    except SpanflowError as exc:
        raise fail(exc) from None
    finally:
        err.print("stopping the cluster …")
        cluster.stop()


def _submit_file(api: Api, path: Path) -> PipelineStatus:
    body = SubmitBody(yaml=path.read_text(), filename=str(path))
    return api.typed(lambda c: c.submit(body))


def _watch(cluster: LocalCluster, stop: _Interrupted, duration: float | None) -> None:
    deadline = time.monotonic() + duration if duration else None
    api = cluster.api()

    def view() -> Group:
        return api.view()

    last = 0.0
    with (
        Live(view(), console=console, refresh_per_second=1)
        if console.is_terminal
        else _Null() as live
    ):
        while not stop.event.is_set() and (deadline is None or time.monotonic() < deadline):
            cluster.check_coordinators()
            if live is not None:
                live.update(view())
            elif time.monotonic() - last > 10:
                last = time.monotonic()
                console.print(view())
            stop.event.wait(1.0)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def _spark_cluster_offer(
    master: str, master_ui: str | None, memory: str | None
) -> tuple[int | None, str | None]:
    """A node on a Spark standalone cluster offers the cluster's cores and memory (what
    its alive workers have), so the planner sizes its work by the cluster, not by the
    machine the agent runs on. Unreadable: this machine's, with a warning."""
    from spanflow.local.spark_cluster import SparkClusterError, cluster_capacity

    host = urlparse(master.replace("spark://", "http://", 1)).hostname or "127.0.0.1"
    ui = master_ui or f"http://{host}:8080"
    try:
        capacity = cluster_capacity(ui)
    except SparkClusterError as exc:
        err.print(f"[yellow]offering this machine's cores: {exc}[/yellow]")
        return None, memory
    err.print(f"Spark cluster {master}: {capacity.cores} cores, {capacity.memory_mb} MB")
    return capacity.cores or None, memory or (
        f"{capacity.memory_mb}m" if capacity.memory_mb else None
    )
