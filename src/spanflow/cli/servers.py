"""``spanflow site-server``: one site's NATS server (a leaf of the hub, or the hub
itself) with the MQTT gateway, on its own host; ``spanflow spark-cluster``: a Spark
standalone cluster for a site's nodes."""

from __future__ import annotations

import signal
import threading
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
        help="The hub's leaf URL (nats-leaf://HOST:7422); without it this server is the hub."
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
        help="Bearer token of HTTP ingest (locked mode: the REST token by default).",
        envvar="SPANFLOW_HTTP_TOKEN",
    ),
]


@app.command("site-server")
def site_server(
    site: Annotated[str, typer.Option(help="Site name: the server's name and JetStream domain.")],
    hub: HubOption = None,
    listen: Annotated[str, typer.Option(help="Client listener, HOST:PORT.")] = "127.0.0.1:4222",
    leaf_listen: Annotated[
        str, typer.Option(help="The hub's listener for site servers, HOST:PORT.")
    ] = "127.0.0.1:7422",
    mqtt_listen: Annotated[
        str | None, typer.Option(help="MQTT gateway for devices, HOST:PORT (none without it).")
    ] = None,
    http_listen: HttpListenOption = None,
    http_token: HttpTokenOption = None,
    deny_export: Annotated[
        list[str] | None,
        typer.Option(help="A subject that stays on this site (repeat), e.g. local.>"),
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Default ./spanflow-data.")] = None,
    open_: Annotated[
        bool,
        typer.Option("--open", help="Run without secrets beyond loopback (a trusted network)."),
    ] = False,
) -> None:
    """Run one site's NATS server with JetStream (domain = the site) and, with
    ``--mqtt-listen``, the MQTT gateway (a PUBACK means stored). With ``--hub`` it joins
    the hub as a leaf node; locked when the data directory has secrets. SIGHUP reloads
    the server's users and certificates (after `spanflow secrets device`)."""
    from spanflow.nats.server import EmbeddedNats
    from spanflow.security.policy import is_loopback

    directory = data_dir_or_default(data_dir)
    secrets = use_secrets(directory, "coordinator")
    host, port = _listen(listen, "--listen")
    leaf_host, leaf_port = _listen(leaf_listen, "--leaf-listen")
    doors = [host] if hub else [host, leaf_host]
    doors += [_listen(given, flag)[0] for given, flag in ((mqtt_listen, "--mqtt-listen"),) if given]
    exposed = not all(is_loopback(door) for door in doors)
    if secrets is None and exposed and not open_:
        raise fail(
            SpanflowError(
                f"site server {site} would listen beyond loopback without TLS or users: "
                "run `spanflow secrets init` (then copy the secrets here) or pass --open"
            )
        )
    if secrets is None:
        err.print(f"[yellow]OPEN MODE: site server {site} has no TLS and no users[/yellow]")
    server = EmbeddedNats(
        directory / f"nats-{site}",
        name=site,
        domain=site,
        host=host,
        port=port or None,
        leaf_listen=hub is None,
        leaf_port=leaf_port,
        leaf_host=leaf_host,
        leaf_remote=hub,
        deny_exports=tuple(deny_export or ()),
        secrets=secrets,
    )
    stop = Interrupted()
    try:
        server.start()
    except SpanflowError as exc:
        raise fail(exc) from None
    gateway = None
    if secrets is not None and not http_token:
        http_token = secrets.credentials().ingest_token_for(site)
    try:
        err.print(f"site {site}: NATS {server.url} (JetStream domain {site})")
        if hub is None:
            err.print(f"hub leaf listener: {server.leaf_url}")
        if mqtt_listen:
            gateway = _mqtt_gateway(server.url, mqtt_listen, secrets)
        with ingest(server.url, http_listen, http_token):
            _serve_until(stop.event, server, site)
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()


def _mqtt_gateway(nats_url: str, listen: str, secrets: Any) -> Any:
    from spanflow.doors.mqtt_gateway import GatewayThread

    host, port = _listen(listen, "--mqtt-listen")
    try:
        gateway = GatewayThread(nats_url, host, port, secrets=secrets).start()
    except SpanflowError as exc:
        raise fail(exc) from None
    err.print(f"MQTT listener on {gateway.host}:{gateway.port}")
    return gateway


def _serve_until(stop: threading.Event, server: Any, site: str) -> None:
    """Until ``stop``; SIGHUP reloads the server's users and certificates."""
    reload = threading.Event()
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
