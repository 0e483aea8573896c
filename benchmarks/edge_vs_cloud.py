"""Edge vs cloud: what spanflow's placement saves on the WAN and in alert latency.

The same pipeline — per-device validation, per-reading alerts, 10 s window aggregates
per device gathered in the cloud — from two factories, run twice on one machine with
the WAN emulated by user-space relays (these machines have no ``tc netem``):

(a) **planned**: each factory has its own NATS server (a leaf node of the cloud's);
    sensors publish to it; spanflow runs validation, alerts and the windows at the
    factory and sends only the window results to the cloud.
(b) **all in the cloud**: sensors publish to the cloud's server across the WAN; the
    whole pipeline runs on the cloud node.

Alerts are consumed where the alarm sounds, in the factory (a subscriber on the
factory's server). Every relay adds the one-way delay in each direction and counts
the bytes that cross: device traffic, leaf-node traffic (window results, alerts
coming back, and the control plane's heartbeats and assignments, which both setups
pay). Alert latency = alert received in the factory - the reading's publish time
(one machine, one clock). Alerts run in Spark's Real-Time Mode (``--alerts microbatch``:
on the 2 s trigger), window results on a 10 s trigger.

In real time an alert costs its processing (≈1-3 ms) plus whatever WAN lies on its
path. On micro-batches most of its latency is the wait for its batch, uniform over the
2 s trigger, so the median of a few hundred alerts moves by ±40-60 ms from run to run
on sampling alone — as much as the RTT being measured. 10 % of readings raise alerts
(``--hot``): ≈3,000 per setup per minute, which steadies the median to about ±20 ms.

Both setups run the same processes (hub, two factory servers, coordinator, three
agents with their own Spark); only where the work runs differs. The CPU each agent
(with its Spark and Python workers) and the whole machine used while measuring is
reported too: the planned setup runs a Spark per factory, which on one 2-core machine
compete for the same cores, where real factories would each bring their own.
Leaf links compress (NATS's default ``s2_auto``), as they would in production.
Figures go to ``benchmarks/results/edge_vs_cloud.json``.

The factories' Sparks share the machine's cores. Their batches start in different
slots (``spanflow up`` gives each local node its own ``--batch-offset``), and
``--pin-sites`` puts each factory on a core of its own, closer to separate hardware
(the cloud still gets every core).

Run: ``.venv/bin/python benchmarks/edge_vs_cloud.py [--rtt 30 100] [--seconds 60] [--pin-sites]``

Debugging the WAN bytes: ``SPANFLOW_LEAF_COMPRESSION=off SPANFLOW_RELAY_TALLY=1`` prints
the bytes per subject that crossed the leaf links (uncompressed, so larger).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import orjson
import psutil

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import spanflow as sf
from spanflow.local.cluster import LocalCluster
from spanflow.nats.relay import WanRelay
from spanflow.nats.streams import connect

RESULTS = Path(__file__).resolve().parent / "results"
SITES = ("factory-a", "factory-b")
SCHEMA = {"device": "string", "site": "string", "ts": "timestamp", "temperature": "double"}
ALERT_ABOVE = 45.0


def topology(mode: str) -> str:
    """The planned setup declares where the readings are born; the all-in-cloud one
    lands them in the cloud."""

    def edge(site: str, node: str) -> str:
        # Streams hosted at a site keep their subjects at home: the leaf link does not
        # export them, so no other site's stream on the same subjects pulls them over.
        streams = (
            f'\n    streams: [{{name: SENSORS, subjects: ["sensors.{site}.>"]}},'
            ' {name: ALERTS, subjects: ["alerts.*.*"]}]'
            if mode == "planned"
            else ""
        )
        return (
            f"  - name: {node}\n    site: {site}\n    local: true\n"
            f"    capabilities: {{cores: 2, slots: 2}}{streams}\n"
        )

    cloud_streams = (
        '\n    streams: [{name: SENSORS, subjects: ["sensors.>"]}]' if mode == "cloud" else ""
    )
    return (
        "sites: [{name: factory-a}, {name: factory-b}, {name: cloud, kind: cloud}]\n"
        "nodes:\n"
        + edge("factory-a", "edge-a")
        + edge("factory-b", "edge-b")
        + "  - name: cloud-1\n    site: cloud\n    local: true\n"
        + f"    capabilities: {{cores: 2, slots: 4}}{cloud_streams}\n"
        + "links:\n"
        + "  - {between: [factory-a, cloud], latency: 15ms}\n"
        + "  - {between: [factory-b, cloud], latency: 15ms}\n"
    )


def pipeline(alerts_mode: str = "realtime") -> sf.Flow:
    """``alerts_mode``: the alert path in Spark's Real-Time Mode (``realtime``, the
    default) or on the 2 s micro-batches (``microbatch``)."""
    p = sf.Pipeline("edge-vs-cloud", trigger="2s")
    readings = p.source(
        "SENSORS",
        subjects=["sensors.>"],
        schema=SCHEMA,
        key="device",
        event_time="ts",
        max_out_of_orderness="2s",
        id="readings",
    )
    valid = readings.filter("temperature BETWEEN -40 AND 125", id="valid")
    hot = valid.filter(f"temperature > {ALERT_ABOVE}", id="hot")
    if alerts_mode == "realtime":
        hot = hot.realtime()
    alerts = hot.sink_jetstream("ALERTS", subject="alerts.{site}.{device}", id="alerts_out")
    windows = (
        valid.key_by("device", id="by_device")
        .window(tumbling="10s")
        .aggregate(n="count", avg_t="avg(temperature)", max_t="max(temperature)", id="per_10s")
        # 10 s windows need no 2 s batches: each costs a small node the same planning
        # and state commits whether a window closed or not (alerts keep the 2 s trigger).
        .sink_jetstream("WINDOWS", subject="windows.{device}", trigger="10s", id="windows_out")
    )
    return alerts.merge(windows)


def spec_with_cloud_sink(alerts_mode: str = "realtime") -> dict[str, Any]:
    """The pipeline with its window results gathered in the cloud, whatever runs where."""
    spec = pipeline(alerts_mode).spec()
    steps = [
        s.model_copy(update={"at": "cloud"}) if s.id == "windows_out" else s for s in spec.steps
    ]
    return spec.model_copy(update={"steps": tuple(steps)}).model_dump(mode="json", by_alias=True)


class Publisher:
    """``rate`` readings/s per site from ``devices`` devices; a ``hot`` share of them alerts."""

    def __init__(self, urls: dict[str, str], rate: float, devices: int, hot: float) -> None:
        self.urls, self.rate, self.devices, self.hot = urls, rate, devices, hot
        self.stop = threading.Event()
        self.sent: dict[str, int] = dict.fromkeys(urls, 0)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def join(self) -> None:
        self.stop.set()
        self._thread.join(30)

    async def _run(self) -> None:
        await asyncio.gather(*(self._site(site, url) for site, url in self.urls.items()))

    async def _site(self, site: str, url: str) -> None:
        nc = await connect(url)
        rng = random.Random(site)
        period = 1.0 / self.rate
        next_at = time.monotonic()
        n = 0
        while not self.stop.is_set():
            hot = rng.random() < self.hot
            record = {
                "device": f"{site}-{n % self.devices:03d}",
                "site": site,
                "ts": time.time(),
                "temperature": round(rng.uniform(60, 90) if hot else rng.uniform(15, 35), 2),
            }
            await nc.publish(f"sensors.{site}.{record['device']}", orjson.dumps(record))
            self.sent[site] += 1
            n += 1
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await nc.flush()
        await nc.close()


class AlertClock:
    """Subscribes in each factory and records alert latency (receive - publish time)."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.latencies: list[tuple[float, float]] = []  # (reading ts, latency s)
        self.received: dict[str, int] = dict.fromkeys(urls, 0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._conns: list[Any] = []

    def start(self) -> AlertClock:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._subscribe(), self._loop).result(30)
        return self

    async def _subscribe(self) -> None:
        for site, url in self.urls.items():
            nc = await connect(url)
            self._conns.append(nc)

            async def on_alert(msg: Any, site: str = site) -> None:
                now = time.time()
                r = orjson.loads(msg.data)
                ts = datetime.fromisoformat(r["ts"]).timestamp()
                self.received[site] += 1
                self.latencies.append((ts, now - ts))

            await nc.subscribe(f"alerts.{site}.>", cb=on_alert)

    def stop(self) -> None:
        async def close() -> None:
            for nc in self._conns:
                await nc.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if values else 0.0


def cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """CPU time used so far by each cluster process with its children (agent + Spark),
    and by the whole machine."""
    out: dict[str, float] = {}
    for name, proc in cluster.procs.items():
        try:
            root = psutil.Process(proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        total = 0.0
        for p in tree:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        out[name] = total
    t = psutil.cpu_times()
    out["machine"] = t.user + t.system + getattr(t, "nice", 0.0)
    return out


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Keep an agent, its Spark and its Python workers on ``cpus`` (threads and
    processes started later inherit the mask)."""
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            for thread in proc.threads():
                with contextlib.suppress(OSError):  # the thread ended meanwhile
                    os.sched_setaffinity(thread.id, cpus)


def run(
    mode: str,
    one_way: float,
    rate: float,
    seconds: float,
    devices: int,
    keep: bool = False,
    pin_sites: bool = False,
    hot: float = 0.1,
    alerts_mode: str = "realtime",
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"spanflow-bench-{mode}-"))
    (work / "topology.yaml").write_text(topology(mode))
    cluster = LocalCluster(
        work / "topology.yaml", work, port=0, site_servers=True, wan_delay=one_way
    )
    device_relays: dict[str, WanRelay] = {}
    publisher: Publisher | None = None
    clock: AlertClock | None = None
    try:
        cluster.start()
        cluster.wait_for_nodes(timeout=300)
        api = cluster.api()
        st = api.call("POST", "/api/v1/pipelines", {"spec": spec_with_cloud_sink(alerts_mode)})
        placement = {f["id"]: f["node"] for f in st["fragments"]}
        if mode == "cloud":  # sensors reach the cloud's server across the WAN
            hub = urlparse(cluster.nats_url)
            for site in SITES:
                device_relays[site] = WanRelay(hub.hostname or "", hub.port or 0, delay=one_way)
                device_relays[site].start()
            targets = {s: f"nats://127.0.0.1:{device_relays[s].port}" for s in SITES}
        else:
            targets = {s: cluster.site_urls[s] for s in SITES}
        clock = AlertClock({s: cluster.site_urls[s] for s in SITES}).start()
        publisher = Publisher(targets, rate, devices, hot).start()
        # Warm up: until both factories hear alerts (every Spark query is running).
        deadline = time.monotonic() + 400
        while not all(clock.received.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: no alerts within 400 s; logs in {work / 'logs'}")
            time.sleep(0.5)
        # ... and until the backlog of the slow first batches is gone: the last 30
        # alerts' median latency under 3 s (or 120 s at most).
        settle = time.monotonic() + 120
        while time.monotonic() < settle:
            recent = [latency for _, latency in clock.latencies[-30:]]
            if len(recent) == 30 and pct(recent, 50) < 3.0:
                break
            time.sleep(1)
        if pin_sites and mode == "planned":
            cpus = sorted(os.sched_getaffinity(0))
            for i, node in enumerate(("edge-a", "edge-b")):
                pin_tree(cluster.procs[f"node-{node}"].pid, {cpus[i % len(cpus)]})
        relays = [*cluster.relays.values(), *device_relays.values()]
        if os.environ.get("SPANFLOW_RELAY_TALLY"):
            for r in relays:
                r.tally = {}
        bytes_before = sum(r.bytes_up + r.bytes_down for r in relays)
        sent_before = sum(publisher.sent.values())
        cpu_before = cpu_seconds(cluster)
        started = time.time()
        time.sleep(seconds)
        ended = time.time()
        cpu_after = cpu_seconds(cluster)
        cpu = {
            k: max(0.0, round(100 * (cpu_after[k] - v) / (ended - started), 1))
            for k, v in cpu_before.items()
            if k in cpu_after
        }
        wan_bytes = sum(r.bytes_up + r.bytes_down for r in relays) - bytes_before
        sent = sum(publisher.sent.values()) - sent_before
        time.sleep(5)  # alerts of the last readings
        if os.environ.get("SPANFLOW_RELAY_TALLY"):
            tally: dict[str, int] = {}
            for r in relays:
                for k, v in (r.tally or {}).items():
                    tally[k] = tally.get(k, 0) + v
            for k, v in sorted(tally.items(), key=lambda kv: -kv[1])[:15]:
                print(f"   {v:>10,}  {k}")
            for node in api.call("GET", "/api/v1/nodes"):
                for fr in (node.get("agent_fragments") or {}).values():
                    print(
                        f"   {node['name']} {fr['fragment_id']}: batches {fr['batches']} "
                        f"last {fr['last_batch_ms']} ms in {fr['input_rows_per_s']:.0f}/s "
                        f"lag {fr['lag']}"
                    )
        lat = [latency for ts, latency in clock.latencies if started <= ts < ended]
        return {
            "mode": mode,
            "alerts_mode": alerts_mode,
            "rtt_ms": round(one_way * 2000),
            "placement": placement,
            "readings": sent,
            "alerts": len(lat),
            "wan_bytes": wan_bytes,
            "wan_bytes_per_reading": round(wan_bytes / max(1, sent), 1),
            "alert_latency_ms": {
                "p50": round(pct(lat, 50) * 1000, 1),
                "p99": round(pct(lat, 99) * 1000, 1),
                "mean": round(sum(lat) / max(1, len(lat)) * 1000, 1),
            },
            "cpu_percent": cpu,
            "sites_pinned": pin_sites and mode == "planned",
        }
    finally:
        if publisher is not None:
            publisher.join()
        if clock is not None:
            clock.stop()
        for relay in device_relays.values():
            relay.stop()
        cluster.stop()
        if keep:
            print(f"   kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtt", type=float, nargs="+", default=[30.0, 100.0], help="ms")
    ap.add_argument("--seconds", type=float, default=60.0, help="measured seconds per run")
    ap.add_argument("--rate", type=float, default=250.0, help="readings/s per factory")
    ap.add_argument("--devices", type=int, default=20, help="devices per factory")
    ap.add_argument(
        "--hot",
        type=float,
        default=0.1,
        help="share of readings that raise an alert (more alerts, a steadier median: "
        "each alert waits a uniform 0-2 s for its batch, which dominates its latency)",
    )
    ap.add_argument("--modes", nargs="+", default=["planned", "cloud"], help="planned, cloud")
    ap.add_argument(
        "--alerts",
        choices=["realtime", "microbatch"],
        default="realtime",
        help="the alert path in Spark's Real-Time Mode (default) or on 2 s micro-batches",
    )
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (logs)")
    ap.add_argument(
        "--pin-sites",
        action="store_true",
        help="planned setup: each factory's agent and Spark on a core of its own, as "
        "separate hardware would be (the cloud's keeps every core)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "edge_vs_cloud.json")
    args = ap.parse_args()
    rows = []
    for rtt in args.rtt:
        pair = {}
        for mode in args.modes:
            print(f"-- {mode}, RTT {rtt:.0f} ms …", flush=True)
            r = run(
                mode,
                rtt / 2000,
                args.rate,
                args.seconds,
                args.devices,
                args.keep,
                args.pin_sites,
                args.hot,
                args.alerts,
            )
            print(json.dumps(r), flush=True)
            pair[mode] = r
        if set(pair) != {"planned", "cloud"}:
            continue
        planned, cloud = pair["planned"], pair["cloud"]
        rows.append(
            {
                "rtt_ms": rtt,
                "planned": planned,
                "cloud": cloud,
                "wan_bytes_ratio": round(planned["wan_bytes"] / max(1, cloud["wan_bytes"]), 4),
                "wan_bytes_saved_pct": round(
                    100 * (1 - planned["wan_bytes"] / max(1, cloud["wan_bytes"])), 1
                ),
                "alert_p50_ratio": round(
                    planned["alert_latency_ms"]["p50"] / max(0.1, cloud["alert_latency_ms"]["p50"]),
                    3,
                ),
                "alert_mean_ratio": round(
                    planned["alert_latency_ms"]["mean"]
                    / max(0.1, cloud["alert_latency_ms"]["mean"]),
                    3,
                ),
                "alert_p99_ratio": round(
                    planned["alert_latency_ms"]["p99"] / max(0.1, cloud["alert_latency_ms"]["p99"]),
                    3,
                ),
            }
        )
    print()
    print(
        f"{'RTT':>6} {'WAN MB planned':>15} {'WAN MB cloud':>13} {'saved':>7} "
        f"{'p50 ms planned/cloud':>21} {'p99 ms planned/cloud':>21}"
    )
    for row in rows:
        p, c = row["planned"], row["cloud"]
        print(
            f"{row['rtt_ms']:>4.0f}ms {p['wan_bytes'] / 1e6:>15.2f} {c['wan_bytes'] / 1e6:>13.2f} "
            f"{row['wan_bytes_saved_pct']:>6.1f}% "
            f"{p['alert_latency_ms']['p50']:>9.0f} / {c['alert_latency_ms']['p50']:<9.0f} "
            f"{p['alert_latency_ms']['p99']:>9.0f} / {c['alert_latency_ms']['p99']:<9.0f}"
        )
    if not rows:
        return  # one mode alone: nothing to compare, the figures are printed above
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "rate_per_factory": args.rate,
        "devices_per_factory": args.devices,
        "hot_share": args.hot,
        "seconds": args.seconds,
        "sites_pinned": args.pin_sites,
        "runs": rows,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
