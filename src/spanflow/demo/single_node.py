"""The single-node demo: a simulator, the sensor-alerts pipeline in this process
(10 s windows per device, a Real-Time Mode alert per reading over a limit) and its
results live."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live

from spanflow.demo.feed import Row, span, with_latency
from spanflow.demo.pipelines import sensor_alerts
from spanflow.demo.view import ALERT_COLUMNS, alert_cells, table
from spanflow.nats.streams import SyncNats, connect, ensure_stream
from spanflow.simulator import SensorSimulator, SimulatorConfig

StatusTable = Callable[[Any, str], RenderableType]


class SingleNodeDemo:
    def __init__(
        self, url: str, work: Path, rate: float, devices: int, console: Console, err: Console
    ) -> None:
        self.url, self.work = url, work
        self.console, self.err = console, err
        self.spec = sensor_alerts().spec()
        self.sim = SensorSimulator(SimulatorConfig(devices=devices, rate=rate, anomaly_rate=0.0005))
        self.windows: deque[Row] = deque(maxlen=8)
        self.alerts: deque[Row] = deque(maxlen=6)
        self.counts = {"windows": 0, "alerts": 0}
        self._sim_stop = asyncio.Event()

    def run(
        self,
        stop: threading.Event,
        duration: float | None,
        status: StatusTable,
        after_spark: Callable[[], None],
    ) -> str:
        """Run until ``stop`` or ``duration``; the closing line."""
        from spanflow.spark.runner import PipelineRunner
        from spanflow.spark.session import build_session

        client = SyncNats(self.url)
        client.run(lambda: self._follow(client))
        sim_thread = threading.Thread(target=self._simulate, name="simulator", daemon=True)
        sim_thread.start()
        self.err.print("starting Spark (first micro-batch takes ~10-20 s) …")
        spark = build_session(app_name="spanflow-demo")
        after_spark()
        runner = PipelineRunner(
            spark, self.spec, nats_url=self.url, checkpoint_dir=self.work / "checkpoints"
        )
        try:
            runner.start()
            self._watch(runner, stop, duration, status)
        finally:
            self._sim_stop.set()
            sim_thread.join(timeout=10)
            dead = runner.dead_letters()
            runner.stop()
            spark.stop()
            client.close()
        return (
            f"demo finished: {self.sim.stats.sent:,} readings, {self.counts['windows']} window "
            f"results, {self.counts['alerts']} alerts, {dead} dead letters"
        )

    async def _follow(self, client: SyncNats) -> None:
        await ensure_stream(client.js, "SENSORS", ["sensors.>"])
        await client.nc.subscribe("windows.>", cb=self._on_window)
        await client.nc.subscribe("alerts.>", cb=self._on_alert)

    async def _on_window(self, msg: Any) -> None:
        self.counts["windows"] += 1
        self.windows.appendleft(json.loads(msg.data))

    async def _on_alert(self, msg: Any) -> None:
        self.counts["alerts"] += 1
        r = with_latency(json.loads(msg.data))
        self.alerts.appendleft(r)
        if not self.console.is_terminal:
            self.console.print(
                f"ALERT {r['device']} {r['reason']} temperature={r['temperature']:.1f} "
                f"vibration={r['vibration']:.2f} at {r['ts'][11:23]}, "
                f"alerted in {r['latency_ms']:.0f} ms"
            )

    def _simulate(self) -> None:
        async def go() -> None:
            nc = await connect(self.url)
            await self.sim.publish(nc, stop=self._sim_stop)
            await nc.close()

        asyncio.run(go())

    def _view(self, runner: Any, status: StatusTable) -> Group:
        windows = table(
            f"latest 10 s windows ({self.counts['windows']} so far)",
            ("device", "window", "readings", "avg °C", "max °C", "max vib"),
            (
                (
                    r["device"],
                    span(r),
                    str(r["readings"]),
                    f"{r['avg_temperature']:.1f}",
                    f"{r['max_temperature']:.1f}",
                    f"{r['max_vibration']:.2f}",
                )
                for r in list(self.windows)
            ),
        )
        alerts = table(
            f"real-time alerts ({self.counts['alerts']} so far)",
            ALERT_COLUMNS,
            (alert_cells(r) for r in list(self.alerts)),
            style="red",
        )
        stats = self.sim.stats
        sim_line = (
            f"simulator: {stats.sent:,} readings sent, {stats.anomalies} anomalies, "
            f"{stats.malformed} malformed"
        )
        return Group(status(runner, self.spec.name), sim_line, windows, alerts)

    def _watch(
        self, runner: Any, stop: threading.Event, duration: float | None, status: StatusTable
    ) -> None:
        """Live on a terminal; else a progress line and the new windows every 10 s."""
        deadline = time.monotonic() + duration if duration else None
        last_print, last_windows = 0.0, 0
        live_cm = (
            Live(self._view(runner, status), console=self.console, refresh_per_second=2)
            if self.console.is_terminal
            else contextlib.nullcontext()
        )
        with live_cm as live:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                runner.supervise()
                if live is not None:
                    live.update(self._view(runner, status))
                elif time.monotonic() - last_print > 10:
                    last_print = time.monotonic()
                    self._print_progress(runner, self.counts["windows"] - last_windows)
                    last_windows = self.counts["windows"]
                stop.wait(0.5)

    def _print_progress(self, runner: Any, new_windows: int) -> None:
        st, c = runner.status(), self.counts
        self.console.print(
            f"[{time.strftime('%H:%M:%S')}] sent {self.sim.stats.sent:,} readings; "
            f"batches {[s.batches for s in st]}; windows {c['windows']}; "
            f"alerts {c['alerts']}; dead letters {runner.dead_letters()}"
        )
        for r in list(self.windows)[: max(0, min(4, new_windows))]:
            self.console.print(
                f"  window {r['device']} {span(r)} readings={r['readings']} "
                f"avg={r['avg_temperature']:.1f} max={r['max_temperature']:.1f}"
            )
