"""Single-node commands: run, validate, simulate."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from spanflow.cli.common import (
    DataDirOption,
    Interrupted,
    KafkaOption,
    NatsOption,
    SinkStreamOption,
    SourceStreamOption,
    SparkConfOption,
    _error,
    _quiet_spark,
    app,
    console,
    data_dir_or_default,
    err,
    load_target,
    nats_url,
    spark_settings,
)
from spanflow.errors import SpanflowError
from spanflow.protocol.metrics import StreamUsage
from spanflow.spec.locations import resolve
from spanflow.spec.pipeline import PipelineSpec

if TYPE_CHECKING:
    from spanflow.spark.runner import PipelineRunner

log = logging.getLogger("spanflow.run")
USAGE_EVERY = 10.0
"""Seconds between looks at how full the pipeline's streams are."""


def status_table(runner: Any, title: str, usage: list[StreamUsage] | None = None) -> Table:
    table = Table(title=title, expand=False)
    for col in (
        "query",
        "state",
        "batches",
        "in rows/s",
        "done rows/s",
        "batch ms",
        "lag",
        "watermark",
        "restarts",
    ):
        table.add_column(
            col, justify="right" if col not in ("query", "state", "watermark") else "left"
        )
    for st in runner.status():
        state = "[green]running[/]" if st.active else ("[red]failed[/]" if st.error else "stopped")
        table.add_row(
            st.sink,
            state,
            str(st.batches),
            f"{st.input_rows_per_s:,.0f}",
            f"{st.processed_rows_per_s:,.0f}",
            str(st.last_batch_ms),
            f"{st.lag:,}",
            (st.watermark or "-")[:19],
            str(st.restarts),
        )
    caption = f"dead letters: {runner.dead_letters():,}"
    late = runner.late_records()
    caption += f" ({late:,} late for their windows)" if late else ""
    for u in usage or ():
        caption += f"\n[yellow]⚠ {u.warning}[/]" if u.warning else ""
    table.caption = caption
    return table


MqttListenOption = Annotated[
    str | None,
    typer.Option(
        help="Where the MQTT listener binds, HOST:PORT (implies --mqtt; default "
        "127.0.0.1 on a free port). It has no authentication: use 0.0.0.0:1883 only on "
        "a network you trust."
    ),
]
RunHttpListenOption = Annotated[
    str | None,
    typer.Option(
        help="Also take readings over HTTP, HOST:PORT: POST /ingest/<subject> answers "
        "once JetStream has stored them (beyond 127.0.0.1 it needs --http-token)."
    ),
]
FeedOption = Annotated[
    list[str] | None,
    typer.Option(
        help="Publish a JSON-lines file once the pipeline runs, a message per line: "
        "FILE (to the first source's subject) or SUBJECT=FILE. Repeatable."
    ),
]
CheckpointsOption = Annotated[
    str | None,
    typer.Option(
        help="Where the pipeline's checkpoints live: a directory or a Hadoop URL, e.g. "
        "jetstream://spanflow/NAME (in this NATS: another machine resumes from it) or "
        "s3a://BUCKET/NAME. Default: <data-dir>/checkpoints."
    ),
]


@app.command()
def run(
    target: Annotated[str, typer.Argument(help="PIPELINE.yaml, PIPELINE.json or module:object")],
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    master: Annotated[str | None, typer.Option(help="Spark master (default local[2]).")] = None,
    mqtt: Annotated[
        bool, typer.Option(help="Embedded NATS also listens for MQTT (topic a/b = subject a.b).")
    ] = False,
    mqtt_listen: MqttListenOption = None,
    source_stream: SourceStreamOption = None,
    sink_stream: SinkStreamOption = None,
    kafka: KafkaOption = None,
    http_listen: RunHttpListenOption = None,
    http_token: Annotated[
        str | None,
        typer.Option(help="Bearer token HTTP ingest requires.", envvar="SPANFLOW_HTTP_TOKEN"),
    ] = None,
    feed: FeedOption = None,
    checkpoints: CheckpointsOption = None,
    spark_conf: SparkConfOption = None,
) -> None:
    """Run a pipeline on this machine until Ctrl-C, with live status."""
    try:
        spec, functions = load_target(
            target, source_stream=source_stream, sink_stream=sink_stream, kafka=kafka
        )
        feeds = [_feed(spec, given) for given in feed or []]
        conf = spark_settings(spark_conf)
    except SpanflowError as exc:
        _error(exc)
        raise typer.Exit(2) from None
    _check_mqtt(nats, mqtt, mqtt_listen, data_dir)
    _quiet_spark()
    from spanflow.spark.runner import PipelineRunner
    from spanflow.spark.session import build_session

    stop = Interrupted()
    directory = data_dir_or_default(data_dir)
    with (
        nats_url(
            nats,
            directory,
            mqtt=mqtt,
            mqtt_listen=mqtt_listen,
            prepare=partial(_source_streams, spec),
        ) as url,
        ingest(url, http_listen, http_token),
    ):
        err.print(f"starting Spark for pipeline [bold]{spec.name}[/bold] …")
        spark = build_session(
            master=master,
            app_name=f"spanflow-{spec.name}",
            conf=conf,
            realtime_slots=spec.realtime_slots(),
        )
        stop.install()
        runner = PipelineRunner(
            spark,
            spec,
            nats_url=url,
            checkpoint_dir=resolve(checkpoints or directory / "checkpoints"),
            functions=functions,
        )
        try:
            runner.start()
            _publish_feeds(url, feeds)
            _supervise(runner, spec.name, stop.event, duration)
        except SpanflowError as exc:
            _error(exc)
            raise typer.Exit(2) from None
        finally:
            err.print("stopping …")
            runner.stop()
            spark.stop()


def _supervise(
    runner: PipelineRunner, name: str, stop: threading.Event, duration: float | None
) -> None:
    """Restart failed queries and show the status (live on a terminal, else every 10 s)
    until ``stop`` or ``duration``; warn once when a stream nears its limit."""
    deadline = time.monotonic() + duration if duration else None
    live_cm = (
        Live(status_table(runner, name), console=console, refresh_per_second=1, transient=False)
        if console.is_terminal
        else contextlib.nullcontext()
    )
    with live_cm as live:
        last_print = last_usage = 0.0
        usage: list[StreamUsage] = []
        warned: set[str] = set()
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            runner.supervise()
            if time.monotonic() - last_usage > USAGE_EVERY:
                usage, last_usage = runner.stream_usage(), time.monotonic()
                for u in usage:  # logged once each time it crosses the mark
                    if u.warning and u.stream not in warned:
                        log.warning("%s", u.warning)
                warned = {u.stream for u in usage if u.warning}
            if live is not None:
                live.update(status_table(runner, name, usage))
            elif time.monotonic() - last_print > 10:
                console.print(status_table(runner, name, usage))
                last_print = time.monotonic()
            stop.wait(1.0)


def _source_streams(spec: PipelineSpec, url: str) -> str:
    """Create the streams the pipeline reads before devices are told where to publish."""
    from spanflow.nats.streams import connect, ensure_source_streams

    async def go() -> list[str]:
        nc = await connect(url)
        try:
            return await ensure_source_streams(nc.jetstream(), spec)
        finally:
            await nc.close()

    names = asyncio.run(go())
    return f" (stream {', '.join(names)} ready)" if names else ""


def _feed(spec: PipelineSpec, given: str) -> tuple[str, Path]:
    """``SUBJECT=FILE`` or ``FILE`` (the first source's first subject, wildcards filled)."""
    subject, sep, file = given.partition("=")
    if not sep:
        file, subject = given, ""
        for source in spec.sources():
            if source.subjects:
                subject = source.subjects[0].replace(">", "feed").replace("*", "feed")
                break
        if not subject:
            raise SpanflowError(f"--feed {given}: no source declares subjects; give SUBJECT=FILE")
    path = Path(file)
    if not path.is_file():
        raise SpanflowError(f"--feed {given}: no file {file!r}")
    return subject, path


def _publish_feeds(url: str, feeds: list[tuple[str, Path]]) -> None:
    from spanflow.nats.streams import SyncNats, publish_lines

    if not feeds:
        return
    client = SyncNats(url)
    try:
        for subject, path in feeds:
            lines = [ln.encode() for ln in path.read_text().splitlines() if ln.strip()]
            sent = client.run(lambda s=subject, ls=lines: publish_lines(client.js, s, ls))  # type: ignore[misc]
            err.print(f"[dim]fed {sent} messages from {path} to {subject}[/dim]")
    finally:
        client.close()


@app.command()
def validate(
    target: Annotated[str, typer.Argument(help="PIPELINE.yaml or module:object")],
    source_stream: SourceStreamOption = None,
    sink_stream: SinkStreamOption = None,
    kafka: KafkaOption = None,
) -> None:
    """Check a pipeline definition and print its spec as JSON."""
    try:
        spec, _ = load_target(
            target, source_stream=source_stream, sink_stream=sink_stream, kafka=kafka
        )
    except SpanflowError as exc:
        _error(exc)
        raise typer.Exit(2) from None
    console.print_json(spec.to_json())


@app.command()
def simulate(
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    rate: Annotated[float, typer.Option(help="Messages per second.")] = 200.0,
    devices: Annotated[int, typer.Option(help="Number of devices.")] = 10,
    duration: Annotated[
        float | None, typer.Option(help="Seconds to run (default: until Ctrl-C).")
    ] = None,
    count: Annotated[int | None, typer.Option(help="Stop after this many readings.")] = None,
    site: Annotated[str, typer.Option(help="Site name in subjects and records.")] = "site-a",
    stream: Annotated[str, typer.Option(help="Stream to create if missing.")] = "SENSORS",
    anomaly_rate: Annotated[float, typer.Option(help="Fraction of anomalous readings.")] = 0.01,
    malformed_rate: Annotated[float, typer.Option(help="Fraction of malformed messages.")] = 0.005,
    seed: Annotated[int | None, typer.Option(help="Random seed for a repeatable run.")] = None,
) -> None:
    """Publish realistic sensor readings (late, anomalous and malformed ones included)."""
    from spanflow.nats.streams import connect, ensure_stream
    from spanflow.simulator import SensorSimulator, SimulatorConfig

    sim = SensorSimulator(
        SimulatorConfig(
            devices=devices,
            rate=rate,
            site=site,
            seed=seed,
            anomaly_rate=anomaly_rate,
            malformed_rate=malformed_rate,
        )
    )
    stop_flag = Interrupted()

    async def go(url: str) -> None:
        nc = await connect(url)
        await ensure_stream(
            nc.jetstream(), stream, [f"{sim.config.subject_prefix}.{sim.config.site}.>"]
        )
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop_flag.event.is_set():
                await asyncio.sleep(0.2)
            stop.set()

        watcher = asyncio.create_task(watch())
        task = asyncio.create_task(sim.publish(nc, duration=duration, count=count, stop=stop))
        while not task.done():
            await asyncio.sleep(1)
            s = sim.stats
            err.print(
                f"sent {s.sent:,}  ({s.rate:,.0f}/s)  anomalies {s.anomalies}  "
                f"malformed {s.malformed}  late {s.late}",
                end="\r",
            )
        await task
        watcher.cancel()
        await nc.close()
        s = sim.stats
        err.print(f"\nsent {s.sent:,} readings ({s.anomalies} anomalies, {s.malformed} malformed)")

    with nats_url(nats, data_dir_or_default(data_dir)) as url:
        asyncio.run(go(url))


@contextlib.contextmanager
def ingest(url: str, listen: str | None, token: str | None) -> Iterator[None]:
    """HTTP ingest for the duration of the block, when asked for (after the source
    streams exist: a reading answered 200 must find its stream)."""
    if not listen:
        yield
        return
    from spanflow.doors.ingest import IngestServer
    from spanflow.nats.server import split_listen
    from spanflow.security.environment import secrets_from_env
    from spanflow.security.https import server_files, wants_tls

    try:
        host, port = split_listen(listen)
        secrets = secrets_from_env()
        tls = server_files(secrets) if wants_tls(host, secrets) else None
        server = IngestServer(url, host, port, token, tls=tls).start()
    except (ValueError, RuntimeError, SpanflowError) as exc:
        _error(ValueError(f"--http-listen: {exc}"))
        raise typer.Exit(2) from None
    err.print(
        f"HTTP ingest on {server.host}:{server.port} ({server.scheme}; POST /ingest/<subject>)"
    )
    try:
        yield
    finally:
        server.stop()


def _check_mqtt(
    nats: str | None, mqtt: bool, mqtt_listen: str | None, data_dir: Path | None = None
) -> None:
    """MQTT is the embedded server's listener: refuse what cannot be honoured, and an
    open listener beyond loopback (as ``spanflow site-server`` does)."""
    from spanflow.cli.common import find_secrets
    from spanflow.nats.server import split_listen
    from spanflow.security.policy import is_loopback

    if (mqtt or mqtt_listen) and nats:
        _error(ValueError("--mqtt and --mqtt-listen need the embedded server (drop --nats)"))
        raise typer.Exit(2)
    if mqtt_listen:
        try:
            host, _ = split_listen(mqtt_listen)
        except ValueError as exc:
            _error(ValueError(f"--mqtt-listen: {exc}"))
            raise typer.Exit(2) from None
        if not is_loopback(host) and find_secrets(data_dir) is None:
            _error(
                SpanflowError(
                    f"MQTT on {host} would take readings from anyone on the network: run "
                    "`spanflow secrets init` (devices then log in over TLS) or listen on "
                    "127.0.0.1"
                )
            )
            raise typer.Exit(2)
