"""Node throughput and latency: spanflow's pipeline against Spark's bare micro-batch floor.

Measured in one run, on this machine, so the ratios hold even when absolute times
do not:

1. floor — Spark's ``rate`` source → ``noop`` sink: duration of a bare micro-batch.
2. throughput — N events pre-loaded into JetStream, then
   a. source → parse (JSON) → filter → 10 s tumbling window count per key → JetStream
      sink (Spark's built-in window aggregation, all in the JVM);
   b. the same events through a keyed processor (a user's Python class on Spark's
      transformWithState): per-key running count and mean in a ValueState, one output
      row per key and batch;
   events/s over the batches after the first (the first pays Python worker start-up).
3. latency at a fixed input rate, publish time → output visible (both JetStream store
   times, one server clock):
   a. per event, source → parse → filter → JetStream sink;
   b. per window update, the same window pipeline emitting updates, from the newest
      event of the update to the update being visible.

Figures are printed and written to ``benchmarks/results/node_throughput.json``.
Run: ``.venv/bin/python benchmarks/node_throughput.py [--events 500000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from stats import pct

import spanflow as sf
from spanflow.nats import EmbeddedNats
from spanflow.nats.ranges import read_range
from spanflow.nats.streams import connect, ensure_stream
from spanflow.spark.runner import PipelineRunner
from spanflow.spark.session import build_session

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {"device": "string", "ts": "timestamp", "temperature": "double"}
DEVICES = 100


def summary(values: list[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "p50": pct(values, 50),
        "p95": pct(values, 95),
        "p99": pct(values, 99),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def progress_of(runner: PipelineRunner) -> list[dict[str, Any]]:
    q = next(iter(runner.queries.values()))
    assert q is not None
    return list(q.recentProgress)


# -- 1. floor ------------------------------------------------------------------------
def measure_floor(spark: Any, seconds: float, rate: int) -> dict[str, Any]:
    df = spark.readStream.format("rate").option("rowsPerSecond", rate).load()
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(processingTime="0 seconds")
        .start()
    )
    time.sleep(seconds)  # a fixed measuring period, not synchronisation
    q.stop()
    durations = [float(p["durationMs"]["triggerExecution"]) for p in q.recentProgress[3:]]
    return {"batch_ms": summary(durations)}


# -- 2. throughput -------------------------------------------------------------------
async def preload(url: str, stream: str, subject: str, n: int) -> float:
    nc = await connect(url)
    js = nc.jetstream()
    await ensure_stream(js, stream, [subject])
    base = 1_800_000_000.0
    start = time.perf_counter()
    futures = []
    for i in range(n):
        record = {
            "device": f"dev-{i % DEVICES:03d}",
            "ts": datetime.fromtimestamp(base + i / 1000.0, UTC).isoformat(timespec="milliseconds"),
            "temperature": 20.0 + (i % 170) / 10.0,
        }
        futures.append(await js.publish_async(subject, orjson.dumps(record)))
        if len(futures) >= 4000:
            await asyncio.wait_for(asyncio.gather(*futures), 60)
            futures = []
    await asyncio.wait_for(asyncio.gather(*futures), 60)
    elapsed = time.perf_counter() - start
    await nc.close()
    return n / elapsed


def window_pipeline(
    name: str, stream: str, out: str, *, emit: str, partitions: int, batch_rows: int = 200_000
) -> sf.Flow:
    p = sf.Pipeline(name, trigger=0)
    aggregates = {"n": "count"} if emit == "final" else {"n": "count", "newest": "max(_published)"}
    return (
        p.source(
            stream,
            schema=SCHEMA,
            event_time="ts",
            max_out_of_orderness="2s",
            max_rows_per_batch=batch_rows,
            partitions=partitions,
            start="earliest" if emit == "final" else "latest",
        )
        .filter("temperature > -50")
        .key_by("device")
        .window(tumbling="10s")
        .aggregate(emit=emit, **aggregates)
        .sink_jetstream(out, subject=out.lower())
    )


class RunningMean(sf.KeyedProcessor):
    """Per-key running count and mean of the temperature, in one ValueState."""

    def init(self, state: Any) -> None:
        self.stats = state.value("stats", {"n": "long", "mean": "double"})

    def process(self, key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
        stats = self.stats.get() or {"n": 0, "mean": 0.0}
        n, mean = stats["n"], stats["mean"]
        for row in rows:
            n += 1
            mean += (row["temperature"] - mean) / n
        self.stats.set({"n": n, "mean": mean})
        yield {"n": n, "mean": mean}


class KeyedPassThrough(sf.KeyedProcessor):
    """Every record out as it came, with a per-key count in a ValueState: the cost of
    keyed state (transformWithState) alone, without a model."""

    def init(self, state: Any) -> None:
        self.n = state.value("n", "long")

    def process(self, key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
        self.n.set(self.n.get(0) + len(rows))
        for row in rows:
            yield {"device": row["device"], "published": row["published"]}


def keyed_pipeline(name: str, stream: str, out: str, *, batch_rows: int) -> sf.Flow:
    p = sf.Pipeline(name, trigger=0)
    return (
        p.source(stream, schema=SCHEMA, max_rows_per_batch=batch_rows, partitions=2)
        .filter("temperature > -50")
        .key_by("device")
        .process(RunningMean, output_schema={"device": "string", "n": "long", "mean": "double"})
        .sink_jetstream(out, subject=out.lower())
    )


def per_event_pipeline(name: str, stream: str, out: str, *, batch_rows: int) -> sf.Flow:
    """Every event out: the JetStream sink writes one record per event (its cost alone)."""
    p = sf.Pipeline(name, trigger=0)
    return (
        p.source(stream, schema=SCHEMA, max_rows_per_batch=batch_rows, partitions=2)
        .filter("temperature > -50")
        .select("device", "ts", "temperature")
        .sink_jetstream(out, subject=out.lower())
    )


def measure_throughput(spark: Any, url: str, flow: sf.Flow, n: int, work: Path) -> dict[str, Any]:
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=url, checkpoint_dir=work, functions=flow.functions
    ).start()
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            done = sum(int(p["numInputRows"]) for p in progress_of(runner))
            if done >= n:
                break
            time.sleep(0.5)
        progress = progress_of(runner)
    finally:
        runner.stop()
    batches = [p for p in progress if int(p["numInputRows"]) > 0]
    timed = batches[1:]
    rows = sum(int(p["numInputRows"]) for p in timed)
    t0 = _end_time(batches[0])
    t1 = _end_time(timed[-1]) if timed else t0
    return {
        "events": n,
        "batches": len(batches),
        "first_batch_ms": int(batches[0]["durationMs"]["triggerExecution"]),
        "events_per_s": round(rows / (t1 - t0)) if t1 > t0 else None,
        "batch_ms": summary([float(p["durationMs"]["triggerExecution"]) for p in timed]),
        "phase_ms_mean": {
            k: round(statistics.fmean(float(p["durationMs"].get(k, 0)) for p in timed), 1)
            for k in ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets")
        }
        if timed
        else {},
    }


def _end_time(progress: dict[str, Any]) -> float:
    start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return start + float(progress["durationMs"]["triggerExecution"]) / 1000.0


# -- 3. latency ----------------------------------------------------------------------
def reading(n: int) -> dict[str, Any]:
    """The n-th reading of a steady publisher, stamped now."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds")
    return {"device": f"dev-{n % DEVICES:03d}", "ts": now, "temperature": 21.0}


def publish_at_rate(
    url: str,
    subject: str,
    rate: int,
    seconds: float,
    stop: threading.Event,
    make: Callable[[int], dict[str, Any]] = reading,
) -> None:
    """Publish ``make(n)`` for n = 0, 1, ... at ``rate`` per second for ``seconds``."""

    async def go() -> None:
        nc = await connect(url)
        js = nc.jetstream()
        start = time.monotonic()
        sent = 0
        while not stop.is_set() and time.monotonic() - start < seconds:
            due = int((time.monotonic() - start) * rate) - sent
            futures = []
            for _ in range(max(0, due)):
                futures.append(await js.publish_async(subject, orjson.dumps(make(sent))))
                sent += 1
            if futures:
                await asyncio.wait_for(asyncio.gather(*futures), 30)
            await asyncio.sleep(0.005)
        await nc.close()

    asyncio.run(go())


def _iso_us(text: str) -> int:
    dt = datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=UTC)
    return int(dt.timestamp() * 1_000_000)


async def _outputs(url: str, stream: str) -> list[tuple[int, dict[str, Any]]]:
    nc = await connect(url)
    info = await nc.jetstream().stream_info(stream)
    msgs = await read_range(nc, stream, info.state.first_seq, info.state.last_seq + 1)
    await nc.close()
    return [(m.published_us, orjson.loads(m.data)) for m in msgs]


def measure_latency(
    spark: Any, url: str, rate: int, seconds: float, warmup: float, work: Path, kind: str
) -> dict[str, Any]:
    stream_in, out = f"LAT_{kind.upper()}_IN", f"LAT_{kind.upper()}_OUT"
    asyncio.run(ensure(url, stream_in, f"lat{kind}.in"))
    if kind == "window":
        flow = window_pipeline("bench-lat-window", stream_in, out, emit="updates", partitions=1)
    else:
        flow = (
            sf.Pipeline("bench-lat-event", trigger=0)
            .source(stream_in, schema=SCHEMA, start="latest")
            .filter("temperature > -50")
            .select("device", "temperature", "_published AS published")
            .sink_jetstream(out, subject=out.lower())
        )
    field = "newest" if kind == "window" else "published"
    run = latency_run(spark, url, flow, f"lat{kind}.in", rate, seconds, warmup, work, field=field)
    return {"rate": rate, "latency_ms": run["latency_ms"], "batch_ms": run["batch_ms"]}


def latency_run(
    spark: Any,
    url: str,
    flow: sf.Flow,
    subject: str,
    rate: int,
    seconds: float,
    warmup: float,
    work: Path | str,
    make: Callable[[int], dict[str, Any]] = reading,
    field: str = "published",
) -> dict[str, Any]:
    """Run ``flow`` while ``make(n)`` is published to ``subject`` at ``rate``; each
    output's latency from the time in its ``field`` to its own store time, over the
    outputs after ``warmup`` seconds, and the batch durations."""
    sink = flow.spec().sinks()[0].stream
    runner = PipelineRunner(spark, flow.spec(), nats_url=url, checkpoint_dir=str(work)).start()
    stop = threading.Event()
    publisher = threading.Thread(
        target=publish_at_rate, args=(url, subject, rate, warmup + seconds, stop, make)
    )
    try:
        publisher.start()
        publisher.join()
        runner.await_idle()
        progress = progress_of(runner)
    finally:
        stop.set()
        runner.stop()
    outputs = asyncio.run(_outputs(url, sink))
    first_out = outputs[0][0] if outputs else 0
    latencies = [
        (visible - _iso_us(row[field])) / 1000.0
        for visible, row in outputs
        if visible - first_out >= warmup * 1_000_000 and row.get(field)
    ]
    batch = [float(p["durationMs"]["triggerExecution"]) for p in progress[3:]]
    return {
        "latency_ms": summary(latencies),
        "batch_ms": summary(batch),
        "rows": len(outputs),
        "profile": batch_profile(progress[3:]),
    }


PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
STATE_METRICS = ("allUpdatesTimeMs", "commitTimeMs", "numRowsUpdated")
ROCKSDB_METRICS = ("rocksdbLoadLatencyMs", "rocksdbGetCount", "rocksdbPutCount")


def batch_profile(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Where a micro-batch's time goes, as Spark reports it: the mean over the batches
    with input of each phase (ms), and of the stateful operator's update time (summed
    over its tasks), state-store commit and RocksDB figures, plus rows per batch."""
    busy = [p for p in progress if int(p.get("numInputRows", 0)) > 0]
    if not busy:
        return {}
    out: dict[str, float] = {"batches": float(len(busy))}
    out["rows"] = statistics.fmean(float(p["numInputRows"]) for p in busy)
    for phase in ("triggerExecution", *PHASES):
        out[phase] = statistics.fmean(float(p["durationMs"].get(phase, 0)) for p in busy)
    states = [p["stateOperators"][0] for p in busy if p.get("stateOperators")]
    for name in STATE_METRICS if states else ():
        out[f"state.{name}"] = statistics.fmean(float(s.get(name, 0)) for s in states)
    for name in ROCKSDB_METRICS if states else ():
        values = [float(s.get("customMetrics", {}).get(name, 0)) for s in states]
        out[f"state.{name}"] = statistics.fmean(values)
    return {k: round(v, 1) for k, v in out.items()}


async def ensure(url: str, stream: str, subject: str) -> None:
    nc = await connect(url)
    await ensure_stream(nc.jetstream(), stream, [subject])
    await nc.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=200_000, help="source max rows per batch")
    ap.add_argument("--rate", type=int, default=2_000, help="events/s for the latency runs")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per latency run")
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "node_throughput.json")
    ap.add_argument("--skip-latency", action="store_true", help="throughput cases only")
    ap.add_argument(
        "--cases",
        default="window,keyed_processor,per_event_sink",
        help="throughput cases to run (comma-separated; window is the baseline, always run)",
    )
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="spanflow-bench-"))
    # Preloading half a million messages with an fsync each would measure the disk, not
    # spanflow: the benchmark's broker syncs on JetStream's default interval.
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        spark = build_session(app_name="spanflow-bench")
        print("measuring Spark's bare micro-batch floor (rate → noop) …", flush=True)
        floor = measure_floor(spark, seconds=20, rate=args.rate)
        print(
            f"  batch p50 {floor['batch_ms']['p50']:.0f} ms, p99 {floor['batch_ms']['p99']:.0f} ms"
        )
        print(f"pre-loading {args.events:,} events …", flush=True)
        publish_rate = asyncio.run(preload(server.url, "BENCH_IN", "bench.in", args.events))
        flows = {
            "window": window_pipeline(
                "bench-throughput",
                "BENCH_IN",
                "BENCH_WIN",
                emit="final",
                partitions=2,
                batch_rows=args.batch_rows,
            ),
            "keyed_processor": keyed_pipeline(
                "bench-keyed", "BENCH_IN", "BENCH_KEYED", batch_rows=args.batch_rows
            ),
            "per_event_sink": per_event_pipeline(
                "bench-per-event", "BENCH_IN", "BENCH_EVENTS", batch_rows=args.batch_rows
            ),
        }
        chosen = {"window", *args.cases.split(",")}
        flows = {case: flow for case, flow in flows.items() if case in chosen}
        throughputs: dict[str, dict[str, Any]] = {}
        for case, flow in flows.items():
            print(f"throughput ({case}) …", flush=True)
            thr = measure_throughput(spark, server.url, flow, args.events, work / f"ck-{case}")
            thr.update(
                max_rows_per_batch=args.batch_rows, preload_publish_per_s=round(publish_rate)
            )
            throughputs[case] = thr
            if thr["events_per_s"] is None:
                print("  too few batches to time: raise --events or lower --batch-rows")
            else:
                print(
                    f"  {thr['events_per_s']:,} events/s over {thr['batches'] - 1} batches "
                    f"(batch p50 {thr['batch_ms']['p50']:.0f} ms)"
                )
        thr = throughputs["window"]
        keyed = throughputs.get("keyed_processor", {})
        lat = {}
        for kind in () if args.skip_latency else ("event", "window"):
            print(
                f"latency ({kind}) at {args.rate:,} events/s for {args.seconds:.0f} s …", flush=True
            )
            lat[kind] = measure_latency(
                spark, server.url, args.rate, args.seconds, args.warmup, work / f"ck-{kind}", kind
            )
            m = lat[kind]["latency_ms"]
            print(f"  p50 {m['p50']:.0f} ms  p95 {m['p95']:.0f} ms  p99 {m['p99']:.0f} ms")
        spark.stop()

    floor_p99 = floor["batch_ms"]["p99"]
    ratios = {
        f"{kind}_p99_latency_over_floor_p99_batch": round(
            lat[kind]["latency_ms"]["p99"] / floor_p99, 2
        )
        for kind in lat
    }
    ratios["throughput_batch_p50_over_floor_p50"] = round(
        thr["batch_ms"]["p50"] / floor["batch_ms"]["p50"], 2
    )
    if keyed.get("events_per_s") and thr["events_per_s"]:
        ratios["keyed_processor_over_window_events_per_s"] = round(
            keyed["events_per_s"] / thr["events_per_s"], 2
        )
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "floor": floor,
        "throughput": thr,
        "keyed_processor_throughput": keyed,
        "per_event_sink_throughput": throughputs.get("per_event_sink"),
        "latency": lat,
        "ratios": ratios,
        "targets": {
            "events_per_s_at_least": 50_000,
            "p99_latency_within_x_floor": 3.0,
            "throughput_met": bool(thr["events_per_s"] and thr["events_per_s"] >= 50_000),
            "keyed_processor_events_per_s_at_least": 30_000,
            "keyed_processor_met": bool(keyed.get("events_per_s", 0) >= 30_000),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                "ratios": ratios,
                "events_per_s": thr["events_per_s"],
                "keyed_processor_events_per_s": keyed.get("events_per_s"),
                "per_event_sink_records_per_s": throughputs.get("per_event_sink", {}).get(
                    "events_per_s"
                ),
            },
            indent=2,
        )
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
