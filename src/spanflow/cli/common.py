"""Shared pieces of the ``spanflow`` command: the app, consoles, options, helpers."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from spanflow.api import Flow, load_pipeline
from spanflow.errors import MeaningChanged, SpanflowError
from spanflow.local.api import find_secrets as find_secrets
from spanflow.spec import PipelineSpec
from spanflow.spec.topology import Topology

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="spanflow: stream processing for the edge-cloud continuum (Spark + NATS JetStream).",
)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _say_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        console.print(f"spanflow {version('spanflow')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_say_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """spanflow: stream processing for the edge-cloud continuum (Spark + NATS JetStream)."""


NatsOption = Annotated[
    str | None, typer.Option("--nats", help="NATS URL; default: start an embedded server.")
]
DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", help="Where NATS data and checkpoints live (default ./spanflow-data)."
    ),
]
RegistryCoordinatorOption = Annotated[
    str | None,
    typer.Option(
        "--coordinator",
        envvar="SPANFLOW_COORDINATOR",
        help="Go through the coordinators' REST API (URL, or the replicas' URLs "
        "comma-separated): changes are made by the leader and recorded in the control "
        "log. Without it: the registry in this node's NATS (a single node).",
    ),
]
RegistryTokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="SPANFLOW_TOKEN",
        help="Bearer token of the REST API (with --coordinator).",
        show_default=False,
    ),
]


def _error(exc: Exception) -> None:
    """Print an error without wrapping it or reading markup from the user's text."""
    err.print("[red]error:[/red] ", end="")
    err.print(str(exc), markup=False, highlight=False)


def load_target(
    target: str,
    *,
    source_stream: str | None = None,
    sink_stream: str | None = None,
    kafka: str | None = None,
    topology: Topology | None = None,
) -> tuple[PipelineSpec, dict[str, Any]]:
    """A pipeline from a YAML/JSON file or a Python ``module:object`` (Flow or spec).

    ``source_stream``/``sink_stream``: the streams of a seed-format file; ``kafka``:
    the brokers of one that runs between Kafka topics."""
    path = Path(target)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", MeaningChanged)
            spec = load_pipeline(
                path,
                source_stream=source_stream,
                sink_stream=sink_stream,
                bootstrap=kafka,
                topology=topology,
            )
        for w in caught:
            if not issubclass(w.category, MeaningChanged):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
                continue
            err.print("[yellow]warning:[/yellow] ", end="")
            err.print(str(w.message), markup=False, highlight=False)
        return spec, {}
    if source_stream or sink_stream:
        raise SpanflowError("--source-stream/--sink-stream apply to seed-format pipeline files")
    module_name, _, attr = target.partition(":")
    if not attr:
        raise SpanflowError(f"{target!r} is neither a pipeline file nor 'module:object'")
    sys.path.insert(0, os.getcwd())
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SpanflowError(f"cannot load {target!r}: {exc}") from None
    if callable(obj) and not isinstance(obj, Flow | PipelineSpec):
        obj = obj()
    if isinstance(obj, Flow):
        return obj.spec(), obj.functions
    if isinstance(obj, PipelineSpec):
        return obj, {}
    raise SpanflowError(
        f"{target!r} is a {type(obj).__name__}, not a spanflow Flow or PipelineSpec"
    )


SourceStreamOption = Annotated[
    str | None,
    typer.Option(help="Seed-format files: the JetStream stream the pipeline reads."),
]
SinkStreamOption = Annotated[
    str | None,
    typer.Option(help="Seed-format files: the JetStream stream the pipeline writes."),
]
KafkaOption = Annotated[
    str | None,
    typer.Option(
        "--kafka",
        help="Seed-format files with source_topic/sink_topic: the Kafka brokers, "
        "HOST:PORT[,HOST:PORT] (overrides the file's bootstrap).",
    ),
]


def use_secrets(data_dir: Path | None, role: str) -> Any:
    """Locked mode when a secrets directory exists (``SPANFLOW_SECRETS``, else
    ``<data dir>/secrets``): this process and its children then connect as ``role``.
    Returns the :class:`~spanflow.security.secrets.Secrets`, or None in open mode.
    A role adopted earlier in this process (``spanflow node`` → agent) is kept."""
    from spanflow.security.environment import adopt
    from spanflow.security.secrets import ROLE_ENV

    found = find_secrets(data_dir)
    if found is not None:
        adopt(found, os.environ.get(ROLE_ENV) or role)
    return found


@contextlib.contextmanager
def nats_url(
    url: str | None,
    data_dir: Path,
    *,
    mqtt: bool = False,
    mqtt_listen: str | None = None,
    prepare: Callable[[str], str] | None = None,
) -> Iterator[str]:
    """The given URL, or an embedded server's for the duration of the block.
    ``prepare(url)`` runs before the MQTT listener is announced (it creates the
    streams that capture what devices publish) and returns what to say is ready."""
    secrets = use_secrets(data_dir, "coordinator")
    if url:
        yield url
        return
    from spanflow.doors.mqtt_gateway import GatewayThread
    from spanflow.nats import EmbeddedNats
    from spanflow.nats.server import split_listen

    with EmbeddedNats(data_dir / "nats", secrets=secrets) as server:
        err.print(f"[dim]embedded NATS at {server.url} (data in {data_dir / 'nats'})[/dim]")
        ready = prepare(server.url) if prepare is not None else ""
        gateway = None
        if mqtt or mqtt_listen:
            host, port = split_listen(mqtt_listen) if mqtt_listen else ("127.0.0.1", 0)
            try:
                gateway = GatewayThread(server.url, host, port, secrets=secrets).start()
            except SpanflowError as exc:
                raise fail(exc) from None
            err.print(f"MQTT listener on {gateway.host}:{gateway.port}{ready}")
        try:
            yield server.url
        finally:
            if gateway is not None:
                gateway.stop()


def data_dir_or_default(given: Path | None) -> Path:
    """The data directory a command was given, else this host's default; made if
    missing."""
    from spanflow.nats import default_data_dir

    path = given or default_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _quiet_spark() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.getLogger("py4j").setLevel(logging.ERROR)


class Interrupted:
    """Turns SIGINT/SIGTERM into a flag so the main loop can stop cleanly.

    PySpark's SparkContext installs its own SIGINT handler (cancel jobs, raise
    KeyboardInterrupt), so call ``install()`` again once the session exists.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.install()

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._set)
        signal.signal(signal.SIGTERM, self._set)

    def _set(self, *_: object) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt
        self.event.set()


def fail(exc: Exception, code: int = 2) -> typer.Exit:
    """Print an error and return the Exit to raise."""
    _error(exc)
    return typer.Exit(code)


SparkConfOption = Annotated[
    list[str] | None,
    typer.Option(
        help="A Spark setting KEY=VALUE for this process's session (repeatable), e.g. "
        "spark.ui.enabled=true or Spark's Kubernetes settings; wins over spanflow's "
        "defaults.",
    ),
]


def spark_settings(given: list[str] | None) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` pairs as a dict (a malformed one is a clear error)."""
    out: dict[str, str] = {}
    for item in given or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise SpanflowError(f"--spark-conf {item!r}: give KEY=VALUE with a spark.* key")
        out[key.strip()] = value.strip()
    return out
