"""Real-Time Mode against micro-batches: alert and window-update latency, same run.

One NATS server and one Spark session on this machine; a steady publisher sends
readings from 50 devices (10 % of them hot) at a fixed rate. One pipeline with two
sinks runs at a time:

- **alerts**: source → ``filter temp > 45`` → select → JetStream (per event);
- **windows**: source → key by device → 10 s tumbling windows, ``emit: updates``
  (count, max) → JetStream (per key).

Each setup runs the same pipeline in three ways, one after another:

1. ``microbatch`` — spanflow's micro-batches at their fastest (``trigger: 0``: the next
   batch starts as soon as one ends), the Python source and driver-side sink;
2. ``realtime`` — Spark's Real-Time Mode with the default 5-minute batches (a run this
   short never crosses a batch boundary);
3. ``realtime-10s`` — 10 s batches, so the measurement includes batch boundaries (the
   pause while a batch commits and the next starts) as a long run would at its
   boundaries.

Latency, on one server clock:

- ``broker_ms``: the publisher's send time → the reading stored in JetStream (the
  floor every path pays, measured in the same run);
- ``alert_ms``: the reading stored → its alert stored (publish → visible in JetStream);
- ``window_update_ms``: for every reading, its storage → the first update of its
  device's window that counts it (the update's ``n`` reaches the reading's position in
  the window) is stored. A micro-batch's one update per batch answers for all the
  readings in the batch; every reading is measured, not one per update.

Readings in the first ``--warmup`` seconds of each run are left out (worker start-up,
the first batch). Figures are printed and written to
``benchmarks/results/realtime_latency.json``.

Run: ``.venv/bin/python benchmarks/realtime_latency.py [--rates 2000 10000] [--seconds 30]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import psutil

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from stats import pct

import spanflow as sf
from spanflow.nats import EmbeddedNats
from spanflow.nats.ranges import read_range
from spanflow.nats.streams import connect, ensure_stream
from spanflow.protocol.raw import RawRecord
from spanflow.security.environment import adopt
from spanflow.security.secrets import SECRETS_ENV, Secrets
from spanflow.spark.runner import PipelineRunner
from spanflow.spark.session import build_session

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {"device": "string", "temp": "double", "ts": "timestamp", "sent": "long"}
DEVICES = 50
HOT = 45.0
MODES = ("microbatch", "realtime", "realtime-10s")
PERCENTILES = (50, 95, 99, 99.9)


def summary(values: list[float]) -> dict[str, float]:
    out = {f"p{q:g}": round(pct(values, q), 2) for q in PERCENTILES}
    out["n"] = len(values)
    return out


def pipeline(name: str, stream: str, mode: str) -> sf.Flow:
    """Both sinks of one pipeline; ``mode`` picks micro-batches or Real-Time Mode."""
    p = sf.Pipeline(name, trigger=0)
    readings = p.source(stream, schema=SCHEMA, event_time="ts", max_out_of_orderness="1s")

    def tail(stream: sf.Stream) -> sf.Stream:
        if mode == "microbatch":
            return stream
        return stream.realtime(batch="10s" if mode == "realtime-10s" else "5m")

    alerts = tail(
        readings.filter(f"temp > {HOT}").select("device", "temp", "_published AS published")
    ).sink_jetstream(f"{name.upper()}_ALERTS", subject=f"{name}.alerts")
    windows = tail(
        readings.key_by("device")
        .window(tumbling="10s")
        .aggregate(emit="updates", n="count", hottest="max(temp)")
    ).sink_jetstream(f"{name.upper()}_WINDOWS", subject=f"{name}.windows")
    return alerts.merge(windows)


def publish_at_rate(url: str, subject: str, rate: int, seconds: float) -> int:
    """Publish at ``rate``/s for ``seconds`` from a process of its own (so that the
    Spark driver's Python threads cannot delay it), in 1 ms steps; returns how many.
    Core NATS publishes (the stream stores them; the counts are checked after)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return int(pool.apply(_publish, (url, subject, rate, seconds)))


def _publish(url: str, subject: str, rate: int, seconds: float) -> int:
    async def go() -> int:
        nc = await connect(url)
        start = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - start) < seconds:
            for _ in range(int(elapsed * rate) - sent):
                now = time.time_ns()
                hot = sent % 10 == 3
                temp = 50.0 if hot else 20.0 + sent % 7
                data = (
                    f'{{"device":"dev-{sent % DEVICES:02d}","temp":{temp},'
                    f'"ts":{now / 1e9:.6f},"sent":{now}}}'
                ).encode()
                await nc.publish(subject, data)
                sent += 1
            await nc.flush()
            await asyncio.sleep(0.001)
        await nc.flush()
        await nc.close()
        return sent

    return asyncio.run(go())


async def stored(url: str, stream: str) -> list[RawRecord]:
    nc = await connect(url)
    try:
        info = await nc.jetstream().stream_info(stream)
        return await read_range(nc, stream, info.state.first_seq, info.state.last_seq + 1)
    finally:
        await nc.close()


def _window_start(ts_seconds: float) -> int:
    return int(ts_seconds // 10 * 10)


def _iso_s(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def window_latencies(
    inputs: list[RawRecord], updates: list[RawRecord], since_us: int
) -> list[float]:
    """Per reading: its store time → the first stored update of its window that counts it."""
    firsts: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for m in updates:  # in store order
        row = orjson.loads(m.data)
        firsts[(row["device"], _iso_s(row["window_start"]))].append((row["n"], m.published_us))
    out: list[float] = []
    position: dict[tuple[str, int], int] = defaultdict(int)
    for m in inputs:
        row = orjson.loads(m.data)
        key = (row["device"], _window_start(row["ts"]))
        position[key] += 1
        if m.published_us < since_us:
            continue
        seen = next((t for n, t in firsts.get(key, []) if n >= position[key]), None)
        if seen is not None:
            out.append((seen - m.published_us) / 1000.0)
    return out


def run_one(
    spark: Any,
    url: str,
    work: Path,
    mode: str,
    rate: int,
    seconds: float,
    warmup: float,
    doors: str = "open",
) -> dict[str, Any]:
    name = f"rt{rate}{mode.replace('-', '')}{'' if doors == 'open' else doors}"
    stream, subject = f"{name.upper()}_IN", f"{name}.in"
    flow = pipeline(name, stream, mode)

    async def create() -> None:
        nc = await connect(url)
        js = nc.jetstream()
        await ensure_stream(js, stream, [subject])
        await nc.close()

    asyncio.run(create())
    runner = PipelineRunner(spark, flow.spec(), nats_url=url, checkpoint_dir=work / name).start()
    process = psutil.Process()
    tree = [process, *process.children(recursive=True)]
    cpu_before = sum(sum(p.cpu_times()[:2]) for p in tree if p.is_running())
    began = time.time()
    try:
        sent = publish_at_rate(url, subject, rate, warmup + seconds)
        expected_alerts = sum(1 for n in range(sent) if n % 10 == 3)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the outputs have caught up
            alerts = asyncio.run(stored(url, f"{name.upper()}_ALERTS"))
            if len(alerts) >= expected_alerts:
                break
            runner.supervise()
            time.sleep(0.5)
        time.sleep(1.0)  # the last window updates are a query of their own
    finally:
        cpu_after = sum(sum(p.cpu_times()[:2]) for p in tree if p.is_running())
        elapsed = time.time() - began
        runner.stop()
    inputs = asyncio.run(stored(url, stream))
    alerts = asyncio.run(stored(url, f"{name.upper()}_ALERTS"))
    updates = asyncio.run(stored(url, f"{name.upper()}_WINDOWS"))
    since_us = (inputs[0].published_us if inputs else 0) + int(warmup * 1e6)
    broker = [
        m.published_us / 1000.0 - orjson.loads(m.data)["sent"] / 1e6
        for m in inputs
        if m.published_us >= since_us
    ]
    alert_ms: list[float] = []
    for m in alerts:
        row = orjson.loads(m.data)
        published_us = _iso_us(row["published"])
        if published_us >= since_us:
            alert_ms.append((m.published_us - published_us) / 1000.0)
    return {
        "mode": mode,
        "doors": doors,
        "rate": rate,
        "sent": sent,
        "stored": len(inputs),
        "alerts": len(alerts),
        "expected_alerts": expected_alerts,
        "window_updates": len(updates),
        "broker_ms": summary(broker),
        "alert_ms": summary(alert_ms),
        "window_update_ms": summary(window_latencies(inputs, updates, since_us)),
        "cpu_cores_used": round((cpu_after - cpu_before) / elapsed, 2),
    }


def _iso_us(text: str) -> int:
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(dt.timestamp() * 1_000_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--sync-always", action="store_true", help="the server fsyncs every message (default off)"
    )
    parser.add_argument(
        "--doors",
        nargs="+",
        default=["open"],
        choices=["open", "locked"],
        help="locked: a second server with TLS and role users (docs/security.md), same run",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="spanflow-rt-bench-"))
    # spanflow's embedded server fsyncs every message by default (nothing acknowledged is
    # lost); on these disks that caps it near 2,000 stored messages/s in all — inputs and
    # outputs — which would measure the disk. This server fsyncs on JetStream's default
    # schedule instead; ``--sync-always`` measures with the durable default.
    secrets = Secrets(work / "secrets")
    secrets.init()
    servers = {
        doors: EmbeddedNats(
            work / f"nats-{doors}",
            sync_always=args.sync_always,
            secrets=secrets if doors == "locked" else None,
        ).start()
        for doors in args.doors
    }
    spark = build_session(app_name="spanflow-rt-bench", realtime_slots=4)
    runs = []
    try:
        for rate in args.rates:
            for mode in args.modes:
                for doors, server in servers.items():
                    print(f"{mode} at {rate:,}/s, {doors} …", flush=True)
                    if doors == "locked":  # this process, its publisher and the JVM: TLS + users
                        adopt(secrets, "coordinator")
                    else:
                        os.environ.pop(SECRETS_ENV, None)
                    run = run_one(
                        spark, server.url, work, mode, rate, args.seconds, args.warmup, doors
                    )
                    runs.append(run)
                    a, w = run["alert_ms"], run["window_update_ms"]
                    print(
                        f"  alert p50 {a['p50']} p95 {a['p95']} p99 {a['p99']}"
                        f" p99.9 {a['p99.9']} ms"
                        f" | window update p50 {w['p50']} p99 {w['p99']} p99.9 {w['p99.9']} ms"
                        f" | broker p50 {run['broker_ms']['p50']} ms | alerts "
                        f"{run['alerts']}/{run['expected_alerts']} | cpu {run['cpu_cores_used']}",
                        flush=True,
                    )
    finally:
        spark.stop()
        for server in servers.values():
            server.stop()
    report = {
        "benchmark": "realtime_latency",
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "seconds": args.seconds,
        "server_sync_always": args.sync_always,
        "warmup": args.warmup,
        "runs": runs,
        "ratios": ratios([r for r in runs if r["doors"] == "open"]),
        "tls_cost": tls_cost(runs),
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / (
        "realtime_latency_tls.json" if "locked" in args.doors else "realtime_latency.json"
    )
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios"], indent=2))
    print("locked / open:", json.dumps(report["tls_cost"], indent=2))
    print(f"written {out}")


def ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Micro-batch latency over real-time latency, per rate (same run, same machine)."""
    out: dict[str, Any] = {}
    for rate in sorted({r["rate"] for r in runs}):
        by_mode = {r["mode"]: r for r in runs if r["rate"] == rate}
        if "microbatch" not in by_mode or "realtime" not in by_mode:
            continue
        mb, rt = by_mode["microbatch"], by_mode["realtime"]
        out[str(rate)] = {
            f"{path}_{q}": round(mb[path][q] / rt[path][q], 1) if rt[path][q] else None
            for path in ("alert_ms", "window_update_ms")
            for q in ("p50", "p99")
        }
    return out


def tls_cost(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Locked (TLS, users) latency over open latency, per rate and mode (same run)."""
    out: dict[str, Any] = {}
    for run in runs:
        if run["doors"] != "locked":
            continue
        twin = next(
            (
                r
                for r in runs
                if r["doors"] == "open" and (r["rate"], r["mode"]) == (run["rate"], run["mode"])
            ),
            None,
        )
        if twin is None:
            continue
        out[f"{run['rate']} {run['mode']}"] = {
            f"{path}_{q}": round(run[path][q] / twin[path][q], 2) if twin[path][q] else None
            for path in ("alert_ms", "window_update_ms")
            for q in ("p50", "p99")
        }
    return out


if __name__ == "__main__":
    main()
