"""``spanflow demo``: two factories and a cloud region on this machine (or, with
``--single-node``, the sensor-alerts pipeline in this process alone)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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

if TYPE_CHECKING:
    from spanflow.simulator import EpisodeReport


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
            record = _with_latency(json.loads(msg.data))
            alerts.appendleft(record)
            if not console.is_terminal:
                console.print(
                    f"ALERT {record['device']} {record['reason']} "
                    f"temperature={record['temperature']:.1f} "
                    f"vibration={record['vibration']:.2f} at {record['ts'][11:23]}, "
                    f"alerted in {record['latency_ms']:.0f} ms"
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
            a = Table(title=f"real-time alerts ({counts['alerts']} so far)", style="red")
            for col in ("device", "reading at", "reason", "°C", "vib", "alerted in"):
                a.add_column(col)
            for r in list(alerts):
                a.add_row(
                    r["device"],
                    r["ts"][11:23],
                    r["reason"],
                    f"{r['temperature']:.1f}",
                    f"{r['vibration']:.2f}",
                    f"{r['latency_ms']:.0f} ms",
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


DEMO_TOPOLOGY = """\
# The cluster demo: two factories (edge sites) and a cloud region on one machine.
name: demo
sites:
  - {name: factory-a, kind: edge}
  - {name: factory-b, kind: edge}
  - {name: cloud, kind: cloud}
nodes:
  - name: edge-a
    site: factory-a
    local: true
    capabilities: {cores: 1, memory_mb: 1g, slots: 2}
    streams: [{name: SENSORS, subjects: ["sensors.factory-a.>"]}]
  - name: edge-b
    site: factory-b
    local: true
    capabilities: {cores: 1, memory_mb: 1g, slots: 2}
    streams: [{name: SENSORS, subjects: ["sensors.factory-b.>"]}]
  - name: cloud-1
    site: cloud
    local: true
    capabilities: {cores: 2, memory_mb: 2g, slots: 4}
links:
  - {between: [factory-a, cloud], latency: 30ms, bandwidth_mbps: 100}
  - {between: [factory-b, cloud], latency: 50ms, bandwidth_mbps: 50}
  - {between: [factory-a, factory-b], latency: 60ms, bandwidth_mbps: 20}
"""


@app.command()
def demo(
    duration: Annotated[
        float | None, typer.Option(help="Seconds to run (default: until Ctrl-C).")
    ] = None,
    rate: Annotated[float, typer.Option(help="Simulated messages per second per site.")] = 100.0,
    devices: Annotated[int, typer.Option(help="Simulated devices per site.")] = 6,
    single_node: Annotated[
        bool, typer.Option("--single-node", help="One process, one pipeline, no cluster.")
    ] = False,
    nats: Annotated[
        str | None, typer.Option(help="With --single-node: NATS URL (default embedded).")
    ] = None,
    until_global: Annotated[
        int | None,
        typer.Option(hidden=True, help="Stop once every site has this many global summaries."),
    ] = None,
    hosts: Annotated[
        bool,
        typer.Option(
            "--hosts",
            help="Run it across hosts: cloud and factories in their own network namespaces "
            "and addresses, every door locked (needs root).",
        ),
    ] = False,
    cut: Annotated[
        str | None,
        typer.Option(help="With --hosts: unplug a factory for a while, e.g. factory-a:30."),
    ] = None,
) -> None:
    """Two factories and a cloud on this machine, each factory with its own NATS server:
    one pipeline, split by the planner into per-machine anomaly detection and an
    overheat-then-vibration event pattern, per-site
    windows and alerts at the edge and a global summary in the cloud, with the
    cluster's status live."""
    if single_node:
        single_node_demo(duration=duration, rate=rate * 2, devices=devices, nats=nats)
        return
    if hosts:
        from spanflow.cli.demo_hosts import run_hosts_demo

        try:
            run_hosts_demo(duration, rate, devices, cut)
        except SpanflowError as exc:
            _error(exc)
            raise typer.Exit(2) from None
        return
    import tempfile

    from spanflow.cli.cluster import LocalCluster
    from spanflow.demo import SITES, factory_monitoring
    from spanflow.nats.streams import SyncNats, connect
    from spanflow.protocol.rest import SubmitBody
    from spanflow.simulator import SensorSimulator, SimulatorConfig

    stop = _Interrupted()
    work = Path(tempfile.mkdtemp(prefix="spanflow-demo-"))
    topology = work / "topology.yaml"
    topology.write_text(DEMO_TOPOLOGY)
    cluster = LocalCluster(topology, work, port=0, site_servers=True)
    sims = [
        SensorSimulator(
            SimulatorConfig(
                devices=devices,
                rate=rate,
                site=site,
                anomaly_rate=0.01,
                overheat_rate=0.01,  # machines that overheat, then vibrate: the pattern
                seed=i,
            )
        )
        for i, site in enumerate(SITES)
    ]
    windows: dict[str, deque[dict[str, Any]]] = {s: deque(maxlen=4) for s in SITES}
    alerts: deque[dict[str, Any]] = deque(maxlen=5)
    summaries: dict[str, deque[dict[str, Any]]] = {s: deque(maxlen=3) for s in SITES}
    anomalies: deque[dict[str, Any]] = deque(maxlen=6)
    episodes: dict[tuple[str, str, str], dict[str, Any]] = {}  # by (site, device, start)
    seizures: deque[dict[str, Any]] = deque(maxlen=5)
    counts = {
        "windows": 0,
        "alerts": 0,
        "global": 0,
        "anomalies": 0,
        "patterns": 0,
    }
    counts_by_site = dict.fromkeys(SITES, 0)
    printed: deque[str] = deque()
    sim_stop = asyncio.Event()
    client: SyncNats | None = None
    sim_thread: threading.Thread | None = None
    try:
        err.print(
            "starting NATS (a server per factory, linked to the cloud's), the coordinator "
            f"and 3 nodes (logs in {work / 'logs'}) …"
        )
        err.print(
            "[yellow]OPEN MODE (a laptop demo): servers on 127.0.0.1 without TLS or users; "
            "see docs/security.md to lock every door[/yellow]"
        )
        cluster.start()
        err.print(
            f"coordinator {cluster.url}; [bold]dashboard {cluster.url}/ui/[/bold]; "
            "waiting for the nodes (each starts Spark) …"
        )
        cluster.wait_for_nodes()
        api = cluster.api()
        spec = factory_monitoring().spec().model_dump(mode="json", by_alias=True)
        st = api.typed(lambda c: c.submit(SubmitBody(spec=spec)))
        placed = ", ".join(f"{f.id.rsplit('.', 1)[-1]} on {f.node}" for f in st.fragments)
        err.print(f"submitted {st.name} → {placed}")
        client = SyncNats(cluster.nats_url)

        async def on_window(msg: Any) -> None:
            r = json.loads(msg.data)
            counts["windows"] += 1
            windows[r["site"]].appendleft(r)
            printed.append(
                f"window {r['site']}/{r['device']} {_span(r)} readings={r['readings']} "
                f"avg={r['avg_temperature']:.1f} max={r['max_temperature']:.1f}"
            )

        async def on_alert(msg: Any) -> None:
            r = _with_latency(json.loads(msg.data))
            counts["alerts"] += 1
            alerts.appendleft(r)
            printed.append(
                f"ALERT {r['site']}/{r['device']} {r['reason']} "
                f"temperature={r['temperature']:.1f} vibration={r['vibration']:.2f} "
                f"at {r['ts'][11:23]}, alerted in {r['latency_ms']:.0f} ms"
            )

        async def on_global(msg: Any) -> None:
            r = json.loads(msg.data)
            counts["global"] += 1
            counts_by_site[r["site"]] += 1
            summaries[r["site"]].appendleft(r)
            printed.append(
                f"GLOBAL {r['site']} window {_span(r)} devices={r['devices']} "
                f"readings={r['readings']} avg={r['avg_temperature']:.1f} "
                f"max={r['max_temperature']:.1f}"
            )

        async def on_anomaly(msg: Any) -> None:
            r = json.loads(msg.data)
            episodes[(r["site"], r["device"], str(r["episode_start"]))] = r
            counts["anomalies"] += r["episode"] == "start"
            anomalies.appendleft(r)
            injected = _injected_kind(r, sims) or "-"
            if r["episode"] == "start":
                printed.append(
                    f"ANOMALY {r['site']}/{r['device']} episode started "
                    f"{str(r['episode_start'])[11:19]} score={r['peak_score']:.2f} "
                    f"field={r['anomaly_field']} injected={injected}"
                )
            else:
                printed.append(
                    f"ANOMALY {r['site']}/{r['device']} episode "
                    f"{str(r['episode_start'])[11:19]}–{str(r['episode_end'])[11:19]} over: "
                    f"{r['anomalies']} anomalous readings, peak {r['peak_score']:.2f} "
                    f"({r['anomaly_field']}), injected={injected}"
                )

        async def on_pattern(msg: Any) -> None:
            r = json.loads(msg.data)
            counts["patterns"] += 1
            seizures.appendleft(r)
            printed.append(
                f"PATTERN {r['site']}/{r['device']} {r['rule']} "
                f"{str(r['match_start'])[11:19]}–{str(r['match_end'])[11:19]} "
                f"peak={r['peak_temperature']:.1f} vibration={r['vibration']:.2f}"
            )

        async def subscribe() -> None:
            assert client is not None
            await client.nc.subscribe("patterns.>", cb=on_pattern)
            await client.nc.subscribe("anomalies.>", cb=on_anomaly)
            await client.nc.subscribe("windows.>", cb=on_window)
            await client.nc.subscribe("alerts.>", cb=on_alert)
            await client.nc.subscribe("global.>", cb=on_global)

        client.run(subscribe)

        def simulate() -> None:
            async def go() -> None:
                # Each factory's sensors publish to the factory's own server.
                conns = [await connect(cluster.site_urls[site]) for site in SITES]
                await asyncio.gather(
                    *(s.publish(nc, stop=sim_stop) for s, nc in zip(sims, conns, strict=True))
                )
                for nc in conns:
                    await nc.close()

            asyncio.run(go())

        sim_thread = threading.Thread(target=simulate, name="simulators", daemon=True)
        sim_thread.start()
        err.print(
            f"simulating {devices} sensors at each of {', '.join(SITES)} (stream SENSORS "
            "on each factory's server); first windows after ~20 s, global summaries ~20 s later"
        )

        def view() -> Group:
            status = api.view()
            w = Table(title=f"per-site 10 s windows at the edge ({counts['windows']} so far)")
            for col in ("site", "device", "window", "readings", "avg °C", "max °C"):
                w.add_column(col)
            for site in SITES:
                for r in windows[site]:
                    w.add_row(
                        site,
                        r["device"],
                        _span(r),
                        str(r["readings"]),
                        f"{r['avg_temperature']:.1f}",
                        f"{r['max_temperature']:.1f}",
                    )
            g = Table(title=f"global summary in the cloud ({counts['global']} so far)")
            for col in ("site", "window", "devices", "readings", "avg °C", "max °C"):
                g.add_column(col)
            for site in SITES:
                for r in summaries[site]:
                    g.add_row(
                        site,
                        _span(r),
                        str(r["devices"]),
                        str(r["readings"]),
                        f"{r['avg_temperature']:.1f}",
                        f"{r['max_temperature']:.1f}",
                    )
            a = Table(title=f"real-time alerts ({counts['alerts']} so far)", style="red")
            for col in ("site", "device", "reading at", "reason", "°C", "vib", "alerted in"):
                a.add_column(col)
            for r in alerts:
                a.add_row(
                    r["site"],
                    r["device"],
                    r["ts"][11:23],
                    r["reason"],
                    f"{r['temperature']:.1f}",
                    f"{r['vibration']:.2f}",
                    f"{r['latency_ms']:.0f} ms",
                )
            d = Table(
                title=f"anomaly episodes detected at the edge ({counts['anomalies']} so far; "
                "a row when one starts and when it ends)",
                style="magenta",
            )
            for col in ("site", "device", "from", "to", "peak", "field", "anomalous", "injected"):
                d.add_column(col)
            for r in anomalies:
                d.add_row(
                    r["site"],
                    r["device"],
                    str(r["episode_start"])[11:19],
                    str(r["episode_end"])[11:19] if r["episode_end"] else "ongoing",
                    f"{r['peak_score']:.2f}",
                    str(r["anomaly_field"]),
                    str(r["anomalies"]),
                    _injected_kind(r, sims) or "-",
                )
            m = Table(
                title=f"overheat, then vibration within 30 s — event pattern per machine "
                f"({counts['patterns']} so far)",
                style="yellow",
            )
            for col in ("site", "device", "from", "to", "peak °C", "vib"):
                m.add_column(col)
            for r in seizures:
                m.add_row(
                    r["site"],
                    r["device"],
                    str(r["match_start"])[11:19],
                    str(r["match_end"])[11:19],
                    f"{r['peak_temperature']:.1f}",
                    f"{r['vibration']:.2f}",
                )
            sent = sum(s.stats.sent for s in sims)
            injected = sum(s.stats.anomalies for s in sims)
            return Group(
                status, f"simulators: {sent:,} readings sent, {injected:,} anomalous", w, d, m, g, a
            )

        deadline = time.monotonic() + duration if duration else None
        last_print = time.monotonic()
        live_cm = (
            Live(view(), console=console, refresh_per_second=1)
            if console.is_terminal
            else contextlib.nullcontext()
        )
        with live_cm as live:
            while not stop.event.is_set() and (deadline is None or time.monotonic() < deadline):
                if until_global and all(counts_by_site[s] >= until_global for s in SITES):
                    break
                cluster.check_coordinators()
                if live is not None:
                    live.update(view())
                    printed.clear()
                else:
                    while printed:
                        console.print(printed.popleft())
                    if time.monotonic() - last_print > 30:
                        last_print = time.monotonic()
                        console.print(view().renderables[0])
                stop.event.wait(1.0)
        if not console.is_terminal:
            while printed:
                console.print(printed.popleft())
        final = api.typed(lambda c: c.pipelines())
    except SpanflowError as exc:
        _error(exc)
        raise typer.Exit(2) from None
    finally:
        sim_stop.set()
        if sim_thread is not None:
            sim_thread.join(timeout=10)
        if client is not None:
            client.close()
        err.print("stopping the cluster …")
        cluster.stop()
    shutil.rmtree(work, ignore_errors=True)
    states = ", ".join(f"{p.name} {p.state.value}" for p in final)
    console.print(
        f"demo finished: {sum(s.stats.sent for s in sims):,} readings, "
        f"{counts['windows']} site windows, {counts['alerts']} alerts, "
        f"{counts['global']} global summaries; pipelines: {states}; "
        f"{counts['anomalies']} anomaly episodes detected, {counts['patterns']} pattern matches"
    )
    console.print(f"anomaly detection: {_detection_report(episodes, sims).summary()}")


def _seconds(value: Any) -> float:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _injected_kind(r: dict[str, Any], sims: list[Any]) -> str | None:
    """The kind of anomaly the simulator injected on this machine while the detected
    episode ``r`` went on (None: none)."""
    start = _seconds(r["episode_start"])
    end = _seconds(r["episode_end"]) if r["episode_end"] else start
    for sim in sims:
        for e in sim.stats.injected:
            if (
                (e.site, e.device) == (r["site"], r["device"])
                and start <= e.end + 2
                and end >= e.start
            ):
                return str(e.kind)
    return None


def _detection_report(
    episodes: dict[tuple[str, str, str], dict[str, Any]], sims: list[Any]
) -> EpisodeReport:
    """The detected episodes (their last row each) scored against the injected ones."""
    from spanflow.simulator import DetectedEpisode, episode_report

    detected = [
        DetectedEpisode(
            r["site"],
            r["device"],
            _seconds(r["episode_start"]),
            _seconds(r["episode_end"] or r["episode_start"]),
            r["anomalies"],
        )
        for r in episodes.values()
    ]
    return episode_report(detected, [e for sim in sims for e in sim.stats.injected])


def _span(r: dict[str, Any]) -> str:
    return f"{r['window_start'][11:19]}–{r['window_end'][11:19]}"


def _with_latency(alert: dict[str, Any]) -> dict[str, Any]:
    """The alert plus ``latency_ms``: from when the server stored its reading
    (``received``) to now, when the alert reached this subscriber."""
    stored = datetime.fromisoformat(str(alert["received"]).replace("Z", "+00:00"))
    if stored.tzinfo is None:
        stored = stored.replace(tzinfo=UTC)
    return {**alert, "latency_ms": (datetime.now(UTC) - stored).total_seconds() * 1000}
