"""``spanflow demo --single-node``: the sensor-alerts pipeline on this process alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from spanflow.cli.common import (
    _error,
    _Interrupted,
    _quiet_spark,
    app,
    console,
    err,
    nats_url,
)
from spanflow.cli.local import status_table
from spanflow.errors import SpanflowError


def single_node_demo(
    duration: Annotated[
        float | None, typer.Option(help="Seconds to run (default: until Ctrl-C).")
    ] = None,
    rate: Annotated[float, typer.Option(help="Simulated messages per second.")] = 200.0,
    devices: Annotated[int, typer.Option(help="Simulated devices.")] = 8,
    nats: str | None = None,
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


app.command("demo")(single_node_demo)
