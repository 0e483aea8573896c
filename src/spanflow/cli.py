"""The ``spanflow`` command: run, simulate, demo, validate."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from spanflow.api import Flow, load_pipeline
from spanflow.errors import SpanflowError
from spanflow.spec import PipelineSpec

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="spanflow: stream processing for the edge-cloud continuum (Spark + NATS JetStream).",
)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

NatsOption = Annotated[
    str | None, typer.Option("--nats", help="NATS URL; default: start an embedded server.")
]
DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", help="Where NATS data and checkpoints live (default ./spanflow-data)."
    ),
]


def _error(exc: Exception) -> None:
    """Print an error without wrapping it or reading markup from the user's text."""
    err.print("[red]error:[/red] ", end="")
    err.print(str(exc), markup=False, highlight=False)


def load_target(target: str) -> tuple[PipelineSpec, dict[str, Any]]:
    """A pipeline from a YAML/JSON file or a Python ``module:object`` (Flow or spec)."""
    path = Path(target)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        return load_pipeline(path), {}
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


@contextlib.contextmanager
def nats_url(url: str | None, data_dir: Path, *, mqtt: bool = False) -> Iterator[str]:
    """The given URL, or an embedded server's for the duration of the block."""
    if url:
        yield url
        return
    from spanflow.nats import EmbeddedNats

    with EmbeddedNats(data_dir / "nats", mqtt=mqtt) as server:
        err.print(f"[dim]embedded NATS at {server.url} (data in {data_dir / 'nats'})[/dim]")
        if server.mqtt_port:
            err.print(f"[dim]MQTT listener on 127.0.0.1:{server.mqtt_port}[/dim]")
        yield server.url


def _data_dir(given: Path | None) -> Path:
    from spanflow.nats import default_data_dir

    path = given or default_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _quiet_spark() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.getLogger("py4j").setLevel(logging.ERROR)


def status_table(runner: Any, title: str) -> Table:
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
    table.caption = f"dead letters: {runner.dead_letters():,}"
    return table


class _Interrupted:
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
) -> None:
    """Run a pipeline on this machine until Ctrl-C, with live status."""
    try:
        spec, functions = load_target(target)
    except SpanflowError as exc:
        _error(exc)
        raise typer.Exit(2) from None
    _quiet_spark()
    from spanflow.spark.runner import PipelineRunner
    from spanflow.spark.session import build_session

    stop = _Interrupted()
    directory = _data_dir(data_dir)
    with nats_url(nats, directory, mqtt=mqtt) as url:
        err.print(f"starting Spark for pipeline [bold]{spec.name}[/bold] …")
        spark = build_session(master=master, app_name=f"spanflow-{spec.name}")
        stop.install()
        runner = PipelineRunner(
            spark, spec, nats_url=url, checkpoint_dir=directory / "checkpoints", functions=functions
        )
        try:
            runner.start()
            deadline = time.monotonic() + duration if duration else None
            live_ok = console.is_terminal
            with (
                Live(
                    status_table(runner, spec.name),
                    console=console,
                    refresh_per_second=1,
                    transient=False,
                )
                if live_ok
                else contextlib.nullcontext() as live
            ):
                last_print = 0.0
                while not stop.event.is_set() and (deadline is None or time.monotonic() < deadline):
                    runner.supervise()
                    if live is not None:
                        live.update(status_table(runner, spec.name))
                    elif time.monotonic() - last_print > 10:
                        console.print(status_table(runner, spec.name))
                        last_print = time.monotonic()
                    stop.event.wait(1.0)
        except SpanflowError as exc:
            _error(exc)
            raise typer.Exit(2) from None
        finally:
            err.print("stopping …")
            runner.stop()
            spark.stop()


@app.command()
def validate(target: Annotated[str, typer.Argument(help="PIPELINE.yaml or module:object")]) -> None:
    """Check a pipeline definition and print its spec as JSON."""
    try:
        spec, _ = load_target(target)
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
    stop_flag = _Interrupted()

    async def go(url: str) -> None:
        nc = await connect(url)
        await ensure_stream(nc.jetstream(), stream, [f"{sim.config.subject_prefix}.>"])
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

    with nats_url(nats, _data_dir(data_dir)) as url:
        asyncio.run(go(url))


@app.command()
def demo(
    duration: Annotated[
        float | None, typer.Option(help="Seconds to run (default: until Ctrl-C).")
    ] = None,
    rate: Annotated[float, typer.Option(help="Simulated messages per second.")] = 200.0,
    devices: Annotated[int, typer.Option(help="Simulated devices.")] = 8,
    nats: NatsOption = None,
) -> None:
    """Embedded NATS + simulator + the sensor-alerts pipeline, with live results."""
    import tempfile

    _quiet_spark()
    from spanflow.demo import sensor_alerts
    from spanflow.nats.streams import SyncNats, connect, ensure_stream
    from spanflow.simulator import SensorSimulator, SimulatorConfig
    from spanflow.spark.runner import PipelineRunner
    from spanflow.spark.session import build_session

    stop = _Interrupted()
    flow = sensor_alerts()
    spec = flow.spec()
    work = Path(tempfile.mkdtemp(prefix="spanflow-demo-"))
    windows: deque[dict[str, Any]] = deque(maxlen=8)
    alerts: deque[dict[str, Any]] = deque(maxlen=6)
    counts = {"windows": 0, "alerts": 0}
    sim = SensorSimulator(SimulatorConfig(devices=devices, rate=rate, anomaly_rate=0.0005))
    with nats_url(nats, work) as url:
        client = SyncNats(url)
        sim_stop = asyncio.Event()

        async def on_window(msg: Any) -> None:
            counts["windows"] += 1
            windows.appendleft(json.loads(msg.data))

        async def on_alert(msg: Any) -> None:
            counts["alerts"] += 1
            record = json.loads(msg.data)
            alerts.appendleft(record)
            if not console.is_terminal:
                console.print(
                    f"ALERT {record['device']} {record['reason']} "
                    f"max_temperature={record['max_temperature']:.1f} "
                    f"max_vibration={record['max_vibration']:.2f} "
                    f"window {record['window_start'][11:19]}–{record['window_end'][11:19]}"
                )

        async def setup() -> None:
            await ensure_stream(client.js, "SENSORS", ["sensors.>"])
            await client.nc.subscribe("windows.>", cb=on_window)
            await client.nc.subscribe("alerts.>", cb=on_alert)

        client.run(setup)

        def simulate_forever() -> None:
            async def go() -> None:
                nc = await connect(url)
                await sim.publish(nc, stop=sim_stop)
                await nc.close()

            asyncio.run(go())

        sim_thread = threading.Thread(target=simulate_forever, name="simulator", daemon=True)
        sim_thread.start()
        err.print("starting Spark (first micro-batch takes ~10-20 s) …")
        spark = build_session(app_name="spanflow-demo")
        stop.install()
        runner = PipelineRunner(spark, spec, nats_url=url, checkpoint_dir=work / "checkpoints")

        def view() -> Group:
            w = Table(title=f"latest 10 s windows ({counts['windows']} so far)")
            for col in ("device", "window", "readings", "avg °C", "max °C", "max vib"):
                w.add_column(col)
            for r in list(windows):
                w.add_row(
                    r["device"],
                    f"{r['window_start'][11:19]}–{r['window_end'][11:19]}",
                    str(r["readings"]),
                    f"{r['avg_temperature']:.1f}",
                    f"{r['max_temperature']:.1f}",
                    f"{r['max_vibration']:.2f}",
                )
            a = Table(title=f"alerts ({counts['alerts']} so far)", style="red")
            for col in ("device", "window", "reason", "max °C", "max vib"):
                a.add_column(col)
            for r in list(alerts):
                a.add_row(
                    r["device"],
                    f"{r['window_start'][11:19]}–{r['window_end'][11:19]}",
                    r["reason"],
                    f"{r['max_temperature']:.1f}",
                    f"{r['max_vibration']:.2f}",
                )
            sim_line = (
                f"simulator: {sim.stats.sent:,} readings sent, {sim.stats.anomalies} anomalies, "
                f"{sim.stats.malformed} malformed"
            )
            return Group(status_table(runner, spec.name), sim_line, w, a)

        try:
            runner.start()
            deadline = time.monotonic() + duration if duration else None
            last_print = 0.0
            last_windows = 0
            live_cm = (
                Live(view(), console=console, refresh_per_second=2)
                if console.is_terminal
                else contextlib.nullcontext()
            )
            with live_cm as live:
                while not stop.event.is_set() and (deadline is None or time.monotonic() < deadline):
                    runner.supervise()
                    if live is not None:
                        live.update(view())
                    elif time.monotonic() - last_print > 10:
                        last_print = time.monotonic()
                        st = runner.status()
                        console.print(
                            f"[{time.strftime('%H:%M:%S')}] sent {sim.stats.sent:,} readings; "
                            f"batches {[s.batches for s in st]}; windows {counts['windows']}; "
                            f"alerts {counts['alerts']}; dead letters {runner.dead_letters()}"
                        )
                        for r in list(windows)[: max(0, min(4, counts["windows"] - last_windows))]:
                            console.print(
                                f"  window {r['device']} {r['window_start'][11:19]}–"
                                f"{r['window_end'][11:19]} readings={r['readings']} "
                                f"avg={r['avg_temperature']:.1f} max={r['max_temperature']:.1f}"
                            )
                        last_windows = counts["windows"]
                    stop.event.wait(0.5)
        except SpanflowError as exc:
            _error(exc)
            raise typer.Exit(2) from None
        finally:
            sim_stop.set()
            sim_thread.join(timeout=10)
            dead = runner.dead_letters()
            runner.stop()
            spark.stop()
            client.close()
        shutil.rmtree(work, ignore_errors=True)
        console.print(
            f"demo finished: {sim.stats.sent:,} readings, {counts['windows']} window results, "
            f"{counts['alerts']} alerts, {dead} dead letters"
        )


def main() -> None:
    try:
        app()
    except SpanflowError as exc:
        _error(exc)
        sys.exit(2)


if __name__ == "__main__":
    main()
