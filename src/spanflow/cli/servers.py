"""``spanflow site-server``: one site's NATS server (a leaf of the hub, or the hub
itself) with the MQTT gateway, on its own host; ``spanflow spark-cluster``: a Spark
standalone cluster for a site's nodes."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from spanflow.cli.common import (
    Interrupted,
    app,
    console,
    data_dir_or_default,
    err,
    fail,
    use_secrets,
)
from spanflow.cli.local import ingest
from spanflow.errors import NatsError, SpanflowError


def _listen(value: str, option: str) -> tuple[str, int]:
    from spanflow.nats.server import split_listen

    try:
        return split_listen(value)
    except ValueError as exc:
        raise fail(SpanflowError(f"{option}: {exc}")) from None


HubOption = Annotated[
    str | None,
    typer.Option(
        help="The hub's leaf URL (nats-leaf://HOST:7422; comma-separated for every server "
        "of a clustered hub); without it this server is the hub."
    ),
]
ClusterListenOption = Annotated[
    str | None,
    typer.Option(
        help="Join this site's other servers in a NATS cluster: the route listener, "
        "HOST:PORT (the site's streams get three copies)."
    ),
]
RouteOption = Annotated[
    list[str] | None,
    typer.Option(
        "--route",
        help="Another server of this site's cluster, HOST:PORT of its --cluster-listen (repeat).",
    ),
]
ServerNameOption = Annotated[
    str | None,
    typer.Option(
        help="This server's name, unique in the site (default: the site's, or "
        "SITE-HOST-PORT of --cluster-listen in a cluster)."
    ),
]
HttpListenOption = Annotated[
    str | None,
    typer.Option(
        help="HTTP ingest for devices, HOST:PORT: POST /ingest/<subject> answers once "
        "JetStream stored the readings (needs a token beyond loopback)."
    ),
]
HttpTokenOption = Annotated[
    str | None,
    typer.Option(
        help="Bearer token of HTTP ingest (locked mode: the site's own ingest token by "
        "default, which `spanflow secrets ingest-token SITE` prints; never the REST token).",
        envvar="SPANFLOW_HTTP_TOKEN",
    ),
]


SHARED_LEAF_WARNING = (
    "[yellow]leaf links log in with one shared login (bundles made before sites had their "
    "own): give --leaf-site SITE for each site[/yellow]"
)
LeafListenOption = Annotated[
    str, typer.Option(help="The hub's listener for site servers, HOST:PORT.")
]
MqttListenOption = Annotated[
    str | None, typer.Option(help="MQTT gateway for devices, HOST:PORT (none without it).")
]
DenyExportOption = Annotated[
    list[str] | None,
    typer.Option(help="A subject that stays on this site (repeat), e.g. local.>"),
]
LeafSiteOption = Annotated[
    list[str] | None,
    typer.Option(
        help="The hub (no --hub): a site whose server may leaf in, with its own login "
        "(repeat; locked). None given: every site logs in with one shared login."
    ),
]
SiteHubDomainOption = Annotated[
    str,
    typer.Option(
        help="The hub's JetStream domain (with --hub, locked): where this server reads "
        "the device revocation list."
    ),
]
MonitorListenOption = Annotated[
    str | None,
    typer.Option(
        help="NATS's monitoring endpoint, HOST:PORT (its /healthz is a container's "
        "health check; keep it on loopback)."
    ),
]


@app.command("site-server")
def site_server(
    site: Annotated[str, typer.Option(help="Site name: the server's name and JetStream domain.")],
    hub: HubOption = None,
    listen: Annotated[str, typer.Option(help="Client listener, HOST:PORT.")] = "127.0.0.1:4222",
    leaf_listen: LeafListenOption = "127.0.0.1:7422",
    mqtt_listen: MqttListenOption = None,
    http_listen: HttpListenOption = None,
    http_token: HttpTokenOption = None,
    deny_export: DenyExportOption = None,
    leaf_site: LeafSiteOption = None,
    cluster_listen: ClusterListenOption = None,
    route: RouteOption = None,
    server_name: ServerNameOption = None,
    monitor_listen: MonitorListenOption = None,
    hub_domain: SiteHubDomainOption = "hub",
    data_dir: Annotated[Path | None, typer.Option(help="Default ./spanflow-data.")] = None,
    open_: Annotated[
        bool,
        typer.Option("--open", help="Run without secrets beyond loopback (a trusted network)."),
    ] = False,
) -> None:
    """Run one site's NATS server with JetStream (domain = the site) and, with
    ``--mqtt-listen``, the MQTT gateway (a PUBACK means stored). With ``--hub`` it joins
    the hub as a leaf node; with ``--cluster-listen`` and ``--route`` it joins the site's
    other servers in a NATS cluster (routes over TLS when locked), so what the site
    buffers survives the loss of one host. Locked when the data directory has secrets.
    SIGHUP reloads the server's users and certificates (after `spanflow secrets device`)."""
    from spanflow.nats.server import EmbeddedNats
    from spanflow.security.policy import is_loopback

    directory = data_dir_or_default(data_dir)
    secrets = use_secrets(directory, "coordinator")
    host, port = _listen(listen, "--listen")
    leaf_host, leaf_port = _listen(leaf_listen, "--leaf-listen")
    cluster = _cluster(site, host, cluster_listen, route or [], server_name)
    doors = [host] if hub else [host, leaf_host]
    given = ((mqtt_listen, "--mqtt-listen"), (cluster_listen, "--cluster-listen"))
    doors += [_listen(value, flag)[0] for value, flag in given if value]
    exposed = not all(is_loopback(door) for door in doors)
    _check_site_doors(site, hub, exposed and not open_, secrets is not None, bool(leaf_site))
    server = EmbeddedNats(
        directory / f"nats-{cluster.name}",
        name=cluster.name,
        domain=site,
        host=host,
        port=port or None,
        leaf_listen=hub is None,
        leaf_port=leaf_port,
        leaf_host=leaf_host,
        leaf_remote=hub,
        deny_exports=tuple(deny_export or ()),
        cluster_name=site if cluster.routes is not None else None,
        cluster_host=cluster.host,
        cluster_port=cluster.port,
        routes=cluster.routes or (),
        secrets=secrets,
        monitor_listen=_checked(monitor_listen, "--monitor-listen"),
        route_site=site if hub else None,  # an edge site's routes: its own password
        leaf_sites=tuple(leaf_site or ()),
    )
    stop = Interrupted()
    try:
        server.start()
    except SpanflowError as exc:
        raise fail(exc) from None
    if secrets is not None and not http_token:
        http_token = secrets.credentials().ingest_token_for(site)
    reload = threading.Event()
    extras: list[Any] = [_revocation_watch(server.url, secrets, hub and hub_domain, reload)]
    try:
        _announce(server, site, cluster, hub)
        extras.append(_mqtt_gateway(server.url, mqtt_listen, secrets) if mqtt_listen else None)
        with ingest(server.url, http_listen, http_token):
            _serve_until(stop.event, server, site, reload)
    finally:
        for extra in filter(None, extras):
            extra.stop()
        server.stop()


def _check_site_doors(
    site: str, hub: str | None, open_beyond_loopback: bool, locked: bool, leaf_sites: bool
) -> None:
    """Refuse what a site server must not do, and warn about what it does openly."""
    from spanflow.nats.server import leaf_urls

    if not locked and open_beyond_loopback:
        raise fail(
            SpanflowError(
                f"site server {site} would listen beyond loopback without TLS or users: "
                "run `spanflow secrets init` (then copy the secrets here) or pass --open"
            )
        )
    if hub:
        try:
            leaf_urls(hub)
        except ValueError as exc:
            raise fail(SpanflowError(f"--hub: {exc}")) from None
    if not locked:
        err.print(f"[yellow]OPEN MODE: site server {site} has no TLS and no users[/yellow]")
    elif hub is None and not leaf_sites:
        err.print(SHARED_LEAF_WARNING)


def _announce(server: Any, site: str, cluster: _ClusterPlace, hub: str | None) -> None:
    """Say where the started server listens (and, clustered, when it is ready)."""
    err.print(f"site {site}: NATS {server.url} (JetStream domain {site})")
    if cluster.routes is not None:
        err.print(
            f"site {site}: server {cluster.name} in the site's cluster, routes on "
            f"{cluster.host}:{server.cluster_port} to {len(cluster.routes)} other(s)"
        )
        threading.Thread(target=_say_when_ready, args=(server, site), daemon=True).start()
    if hub is None:
        err.print(f"hub leaf listener: {server.leaf_url}")


@dataclass(frozen=True)
class _ClusterPlace:
    """Where one server of a site's NATS cluster listens for routes, and its peers
    (``routes`` None: not clustered)."""

    name: str
    host: str | None = None
    port: int | None = None
    routes: tuple[str, ...] | None = None


def _cluster(
    site: str, host: str, listen: str | None, routes: list[str], name: str | None
) -> _ClusterPlace:
    if listen is None:
        if routes:
            raise fail(SpanflowError("--route needs --cluster-listen (this server's routes)"))
        return _ClusterPlace(name or site)
    route_host, route_port = _listen(listen, "--cluster-listen")
    peers = tuple(_route_url(given) for given in routes)
    if name is None and route_port == 0:
        raise fail(SpanflowError("--cluster-listen with port 0 needs --server-name"))
    where = f"{route_host}-{route_port}".replace(".", "-").replace(":", "-")
    return _ClusterPlace(name or f"{site}-{where}", route_host, route_port or None, peers)


def _say_when_ready(server: Any, site: str) -> None:
    """Tell once the site's cluster can store (a metadata leader is elected: most of
    its servers are up and routed); until then streams cannot be created."""
    leader = server.cluster_leader(timeout=3600.0)
    if leader is not None:
        err.print(f"site {site}: JetStream cluster ready (metadata leader {leader})")


def _route_url(given: str) -> str:
    """``HOST:PORT`` (or ``nats-route://HOST:PORT``) of another server's routes."""
    bare = given.removeprefix("nats-route://")
    host, port = _listen(bare, "--route")
    if port == 0:
        raise fail(SpanflowError(f"--route {given}: a route needs the server's port"))
    return f"nats-route://{host}:{port}"


def _checked(listen: str | None, option: str) -> str | None:
    """``listen`` once it is a valid HOST:PORT (None stays None)."""
    return None if listen is None else "{}:{}".format(*_listen(listen, option))


def _mqtt_gateway(nats_url: str, listen: str, secrets: Any) -> Any:
    from spanflow.doors.mqtt_gateway import GatewayThread

    host, port = _listen(listen, "--mqtt-listen")
    try:
        gateway = GatewayThread(nats_url, host, port, secrets=secrets).start()
    except SpanflowError as exc:
        raise fail(exc) from None
    err.print(f"MQTT listener on {gateway.host}:{gateway.port}")
    return gateway


def _revocation_watch(
    nats_url: str, secrets: Any, hub_domain: str | None, reload: threading.Event
) -> Any:
    """A locked edge site's watch on the hub's device revocation list (None at the hub,
    in open mode, or on secrets that are not a site bundle: no site login)."""
    if not hub_domain or secrets is None or not secrets.credentials().site_leaf:
        return None
    from spanflow.doors.revocation_watch import RevocationWatch

    return RevocationWatch(nats_url, secrets, hub_domain, reload.set).start()


def _serve_until(stop: threading.Event, server: Any, site: str, reload: threading.Event) -> None:
    """Until ``stop``; SIGHUP (or a newer revocation list) reloads the server's users
    and certificates."""
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    while not stop.wait(0.5):
        if reload.is_set():  # new devices or certificates in the secrets
            reload.clear()
            try:
                server.reload()
            except NatsError as exc:  # the old configuration stays in force
                err.print(f"[red]site {site}: reload failed: {exc}[/red]")
                continue
            err.print(f"site {site}: configuration reloaded")


@app.command("spark-cluster")
def spark_cluster(
    workers: Annotated[int, typer.Option(min=1, help="Workers to start on this machine.")] = 1,
    cores: Annotated[int, typer.Option(min=1, help="Cores each worker offers.")] = 1,
    memory: Annotated[str, typer.Option(help="Memory each worker offers, e.g. 2g.")] = "1g",
    host: Annotated[str, typer.Option(help="Address the master and workers bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The master's port (spark://HOST:PORT).")] = 7077,
    ui_port: Annotated[
        int, typer.Option(help="The master's web UI (its /json/ tells nodes the capacity).")
    ] = 8080,
    join: Annotated[
        str | None,
        typer.Option(
            help="A site's running master, spark://HOST:PORT: start only the workers here "
            "(each other machine of the site runs this)."
        ),
    ] = None,
    master_ui: Annotated[
        str | None,
        typer.Option(help="With --join: the master's web UI (default http://HOST:8080)."),
    ] = None,
) -> None:
    """A Spark standalone cluster from the pyspark wheel (a master and its workers), for
    `spanflow node --master spark://HOST:PORT`; with --join, workers for a master on
    another machine of the site. Runs until Ctrl-C."""
    from spanflow.local.spark_cluster import LocalSparkCluster, cluster_capacity

    cluster = LocalSparkCluster(
        workers=workers,
        cores=cores,
        memory=memory,
        host=host,
        port=port,
        ui_port=ui_port,
        join=join,
        join_ui=master_ui,
    )
    stop = Interrupted()
    what = f"joining {join} with" if join else "starting a Spark master and"
    err.print(f"{what} {workers} worker(s) …")
    try:
        cluster.start()
    except SpanflowError as exc:
        raise fail(exc) from None
    try:
        capacity = cluster_capacity(cluster.ui_url)
        err.print(
            f"Spark master {cluster.master_url} (UI {cluster.ui_url}): {capacity.workers} "
            f"worker(s), {capacity.cores} cores, {capacity.memory_mb} MB"
        )
        console.print(cluster.master_url)
        while not stop.event.wait(0.5):
            pass
    finally:
        cluster.stop()
