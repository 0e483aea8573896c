"""Cluster commands: coordinator, up, and the client commands that talk to the
coordinator's REST API (submit, status, cancel, savepoint, resume, drain)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Group
from rich.live import Live
from rich.table import Table

from spanflow.cli.common import (
    Interrupted,
    app,
    console,
    data_dir_or_default,
    err,
    fail,
    use_secrets,
)
from spanflow.errors import SpanflowError
from spanflow.local.api import Api as Api
from spanflow.local.cluster import DEFAULT_PORT
from spanflow.local.cluster import LocalCluster as LocalCluster
from spanflow.protocol.rest import ClusterMetrics, NodeStatus, PipelineStatus, SubmitBody
from spanflow.security.https import require_tls, scheme, server_files, wants_tls
from spanflow.security.policy import require_token
from spanflow.spec.locations import resolve

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
TopologyOption = Annotated[
    Path | None, typer.Option(help="Topology file applied at start (sites, nodes, links).")
]
PortFileOption = Annotated[
    Path | None, typer.Option(help="Write the port listened on to this file.")
]
ReplicaNameOption = Annotated[
    str, typer.Option(help="Replica name, unique among the coordinators.")
]
NodesGossipProfileOption = Annotated[
    str, typer.Option(help="Membership profile nodes use: lan, wan or local_test.")
]
AdvertiseOption = Annotated[
    str | None,
    typer.Option(
        help="URL other coordinators and clients reach this one at (behind NAT or when "
        "listening on 0.0.0.0), e.g. http://cloud-1.example.com:7070."
    ),
]
StateDirOption = Annotated[
    str | None,
    typer.Option(
        help="Checkpoints and savepoints: a directory every node mounts, or a Hadoop "
        "URL (jetstream://<store>/<path> keeps them in the site's NATS; s3a://, "
        "hdfs://, file://). Default: <data-dir>/cluster.",
    ),
]
HubDomainOption = Annotated[
    str | None,
    typer.Option(help="JetStream domain of the NATS server (needed by sites with their own)."),
]
ReplicasOption = Annotated[
    int | None,
    typer.Option(
        help="Copies of the control log and buckets "
        "[default: one per server of the NATS cluster, up to 3]."
    ),
]
LeaseOption = Annotated[
    float | None,
    typer.Option(
        help="Seconds a silent leader keeps the lease before a standby leads "
        "[default: 3 on one NATS server, 19 on a cluster: longer than its failover]."
    ),
]
FailureAfterOption = Annotated[
    int, typer.Option(help="Heartbeat periods of silence after which a node is failed.")
]
RebalanceOption = Annotated[
    bool, typer.Option(help="Move work off nodes overloaded for long (docs/balancing.md).")
]
PublicReadsOption = Annotated[
    bool,
    typer.Option(
        help="Let anyone who reaches the API read it (GET, the dashboard, /metrics) "
        "without the token; writes still need it."
    ),
]
TlsOption = Annotated[
    bool | None,
    typer.Option(
        "--tls/--no-tls",
        help="Serve HTTPS with the deployment's certificate [default: when locked and "
        "listening beyond loopback; plain HTTP beyond loopback is refused].",
    ),
]


@app.command()
def coordinator(
    nats: Annotated[str | None, typer.Option(help="NATS URL; default: an embedded server.")] = None,
    topology: TopologyOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 = any free port).")] = DEFAULT_PORT,
    advertise: AdvertiseOption = None,
    port_file: PortFileOption = None,
    data_dir: Annotated[Path | None, typer.Option(help="Default ./spanflow-data.")] = None,
    state_dir: StateDirOption = None,
    heartbeat: Annotated[float, typer.Option(help="Heartbeat period in seconds.")] = 1.0,
    hub_domain: HubDomainOption = None,
    token: TokenOption = None,
    name: ReplicaNameOption = "coordinator",
    replicas: ReplicasOption = None,
    lease: LeaseOption = None,
    failure_after: FailureAfterOption = 3,
    gossip_profile: NodesGossipProfileOption = "lan",
    rebalance: RebalanceOption = True,
    public_reads: PublicReadsOption = False,
    tls: TlsOption = None,
) -> None:
    """Run a coordinator: REST API, dashboard (/ui), registry, pipeline manager, failure
    detection.

    Several coordinators on one NATS cluster (each with its own ``--name``) elect one
    leader; the others answer reads, redirect writes to it and take over if it dies."""
    from spanflow.api.topology_loader import load_topology
    from spanflow.cli.common import nats_url
    from spanflow.control.coordinator import CoordinatorSettings

    _logging()
    try:
        topo = load_topology(topology) if topology else None
    except SpanflowError as exc:
        raise fail(exc) from None
    directory = data_dir_or_default(data_dir)
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
            data_dir=str(directory),
        )
        sock = _listen(host, port)
        actual = sock.getsockname()[1]
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
        settings.url = advertise or f"{scheme(https)}://{shown}:{actual}"
        if port_file:
            port_file.write_text(str(actual))
        err.print(
            f"coordinator on {scheme(https)}://{host}:{actual} (dashboard /ui, API docs "
            f"/docs; token {_token_mode(settings.token, public_reads)})"
        )
        _serve(settings, sock, certificate)


def _listen(host: str, port: int) -> socket.socket:
    """The coordinator's listening socket (its port known before the server runs)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise fail(SpanflowError(f"cannot listen on {host}:{port}: {exc.strerror}")) from None
    return sock


def _serve(settings: Any, sock: socket.socket, certificate: tuple[str, str] | None) -> None:
    """Run the coordinator's REST API on ``sock`` until the process is told to stop."""
    import uvicorn

    from spanflow.control.coordinator import Coordinator
    from spanflow.server.app import create_app

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
def submit(
    pipeline: Annotated[Path, typer.Argument(help="PIPELINE.yaml or PIPELINE.json")],
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
    priority: Annotated[int, typer.Option(help="Higher is placed first (0-1000).")] = 0,
    latency_budget: Annotated[
        str | None, typer.Option(help="End-to-end latency budget, e.g. 2s.")
    ] = None,
    parallelism: Annotated[int, typer.Option(help="Desired parallelism.")] = 1,
    upgrade: Annotated[
        bool,
        typer.Option(
            "--upgrade",
            help="A new version of the running pipeline of the same name: it starts from "
            "the old one's savepoint with the state every stateful step can keep, or is "
            "refused with the reason per step (the old one keeps running).",
        ),
    ] = False,
) -> None:
    """Submit a pipeline to the coordinator (or, with --upgrade, a new version of one)."""
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
    if upgrade:
        _upgrade(pipeline, text, json_spec, body, Api(coordinator_url, token))
        return
    try:
        status = Api(coordinator_url, token).typed(lambda c: c.submit(body))
    except SpanflowError as exc:
        raise fail(exc) from None
    placed = ", ".join(f"{f.id} → {f.node or 'waiting'}" for f in status.fragments)
    console.print(f"submitted [bold]{status.name}[/bold]: {status.state.value} ({placed})")


def _upgrade(path: Path, text: str, json_spec: Any, body: SubmitBody, api: Api) -> None:
    """Send a new version and print each stateful step's verdict."""
    name = _pipeline_name(path, text, json_spec)
    try:
        answer = api.typed(lambda c: c.upgrade(name, body))
    except SpanflowError as exc:
        raise fail(exc) from None
    console.print(
        f"upgrading [bold]{name}[/bold]: {answer.pipeline.state.value} "
        "(the new version starts from the savepoint once every fragment stopped there)"
    )
    for step in answer.steps:
        detail = f" ({step.detail})" if step.detail else ""
        console.print(f"  {step.sink} / {step.step}: {step.verdict}{detail}")


def _pipeline_name(path: Path, text: str, json_spec: Any) -> str:
    """The name a pipeline file gives its pipeline (the coordinator checks the rest)."""
    import yaml

    try:
        data = json_spec if json_spec is not None else yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise fail(SpanflowError(f"{path}: not YAML: {exc}")) from None
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise fail(SpanflowError(f"{path}: no 'name:' at the top: which pipeline to upgrade?"))
    return name


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
    colour = {
        "alive": "green",
        "dead": "red",
        "suspect": "red",
        "fenced": "red",
        "draining": "yellow",
        "last-known": "yellow",
        "declared": "dim",
    }
    nt = Table(title="nodes")
    widest = max((len(n.name) for n in nodes), default=4)
    nt.add_column("node", no_wrap=True, min_width=widest)
    for col in ("site", "health", "slots", "cpu %", "fragments", "heartbeat"):
        nt.add_column(col)
    for n in nodes:
        beat = n.last_heartbeat_s
        nt.add_row(
            n.name,
            n.spec.site,
            f"[{colour.get(n.health, 'white')}]{n.health}[/]",
            f"{len(n.fragments)}/{n.slots}",
            "-" if n.cpu_percent is None or n.health == "dead" else f"{n.cpu_percent:.0f}",
            ", ".join(n.fragments) or "-",
            "-" if beat is None else f"{beat:.1f} s ago",
        )
    pcolour = {"healthy": "green", "degraded": "red"}
    pt = Table(title="pipelines")
    widest = max((len(p.name) for p in pipelines), default=8)
    pt.add_column("pipeline", no_wrap=True, min_width=widest)
    pt.add_column("state", no_wrap=True, min_width=8)
    for col in ("fragments", "rows in", "rows/s", "lag", "dead", "reason"):
        pt.add_column(col)
    for p in pipelines:
        live = [
            f.runtime for f in p.fragments if f.runtime is not None and f.status != "unreachable"
        ]
        shown = "degraded" if p.health == "degraded" else p.state.value
        pt.add_row(
            p.name,
            f"[{pcolour.get(p.health, 'white')}]{shown}[/]",
            ", ".join(f"{f.id}@{f.node or '-'}:{f.status}" for f in p.fragments),
            f"{p.rows_in:,}",
            f"{p.input_rows_per_s:,.0f}",
            f"{sum(r.lag for r in live):,}",
            f"{sum(r.dead_letters for r in live):,}",
            p.reason[:60],
        )
    summary = (
        f"slots {metrics.slots_used}/{metrics.slots} used "
        f"({metrics.utilisation:.0%}), cpu {metrics.cpu_percent:.0f}%, "
        f"throughput {metrics.throughput_rows_per_s:,.0f} rows/s"
    )
    warnings = [f"[yellow]⚠ {n.name}: {w}[/]" for n in nodes for w in n.warnings]
    return Group(nt, pt, summary, *warnings)


def status_view(api: Api) -> Group:
    """The status view of nodes, pipelines and the cluster."""
    return api.typed(lambda c: cluster_view(c.nodes(), c.pipelines(), c.cluster_metrics()))


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
SiteServersOption = Annotated[
    bool,
    typer.Option(
        "--site-servers/--shared-server",
        help="Give every edge site its own NATS server (a leaf node of the hub), or run "
        "all sites on one.",
    ),
]
HaOption = Annotated[
    bool,
    typer.Option(
        "--ha",
        help="High availability: a three-server NATS cluster (control log and buckets "
        "replicated three times) and three coordinators electing a leader.",
    ),
]
SecureOption = Annotated[
    bool,
    typer.Option(
        "--secure/--open",
        help="Lock every door (the default): TLS and role credentials on NATS, sealed "
        "gossip, the REST token, with secrets made in <data dir>/secrets if missing; "
        "--open runs without them (docs/security.md).",
    ),
]


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
    site_servers: SiteServersOption = True,
    wan_delay: Annotated[
        str,
        typer.Option(help="One-way delay added between each edge server and the hub, e.g. 30ms."),
    ] = "0s",
    token: TokenOption = None,
    ha: HaOption = False,
    secure: SecureOption = True,
) -> None:
    """Start NATS, the coordinator and every local node of a topology, with one status view.

    Each edge site gets its own NATS server, linked to the hub's as a leaf node through
    a relay on this machine (``--wan-delay`` emulates the distance)."""
    from spanflow.spec.durations import parse_duration

    stop = Interrupted()
    directory = data_dir_or_default(data_dir)
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
    _say_mode(cluster, directory)
    try:
        _start(cluster, directory)
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


def _say_mode(cluster: LocalCluster, directory: Path) -> None:
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


def _start(cluster: LocalCluster, directory: Path) -> None:
    """Start the cluster, saying where each part is."""
    local = sum(n.local for n in cluster.topology.nodes)
    what = "three NATS servers, three coordinators" if cluster.ha else "NATS, the coordinator"
    err.print(f"starting {what} and {local} nodes (logs in {directory / 'logs'}) …")
    cluster.start()
    err.print(f"coordinator: {cluster.url}   (export SPANFLOW_COORDINATOR={cluster.url})")
    if cluster.ha:
        err.print(f"NATS cluster: {cluster.nats_url}; leader: {cluster.leader()}")
    for site, url in cluster.site_urls.items():
        mqtt = cluster.site_mqtt[site]
        err.print(
            f"site {site}: NATS {url} (JetStream domain {site}), MQTT {mqtt.host}:{mqtt.port}"
        )


def _submit_file(api: Api, path: Path) -> PipelineStatus:
    body = SubmitBody(yaml=path.read_text(), filename=str(path))
    return api.typed(lambda c: c.submit(body))


def _watch(cluster: LocalCluster, stop: Interrupted, duration: float | None) -> None:
    deadline = time.monotonic() + duration if duration else None
    api = cluster.api()

    def view() -> Group:
        return status_view(api)

    last = 0.0
    with (
        Live(view(), console=console, refresh_per_second=1)
        if console.is_terminal
        else contextlib.nullcontext() as live
    ):
        while not stop.event.is_set() and (deadline is None or time.monotonic() < deadline):
            cluster.check_coordinators()
            if live is not None:
                live.update(view())
            elif time.monotonic() - last > 10:
                last = time.monotonic()
                console.print(view())
            stop.event.wait(1.0)
