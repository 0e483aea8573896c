"""Throughput of the model steps on one node, against a plain keyed processor in the
same run.

N events (100 devices; temperature, vibration and a label) are pre-loaded into
JetStream, then read by one pipeline per case, each a keyed step per device:

* ``keyed_baseline``: a keyed processor keeping a running mean (the node_throughput
  keyed case: the cost of Spark's transformWithState and the Python adapter);
* ``detect_default``: ``detect_anomalies`` with the default method (likelihood);
* ``detect_robust``: ``detect_anomalies(method="robust")`` (the earlier default);
* ``detect_hst``: ``detect_anomalies(method="hst")`` (River's Half-Space Trees);
* ``learn_logreg``: ``learn("river:linear_model.LogisticRegression")``;
* ``score_onnx``: ``score`` with a registry model (a scikit-learn logistic regression
  as ONNX, run by onnxruntime once per Arrow batch).

Every case writes little (detection emits only anomalies; learning and scoring are
followed by a filter that keeps nothing), so the figures are of the steps, not of
publishing 400,000 results. Events/s are taken over the batches after the first.
The added cost per event of a case is ``1/rate(case) - 1/rate(baseline)``, in
microseconds.

Then the *added latency* of each step at a steady ``--rate`` (2,000 events/s): the
time from an event's publication to its output being visible (both JetStream store
times, one clock), per event, for a stateless per-event pipeline (filter → sink: the
baseline) and for the same pipeline with the model step before the sink (every event
out: detection emits all, learning and scoring keep every row). Added latency =
case percentile - baseline percentile, same run. ``keyed_passthrough`` (a keyed
processor passing every record on) separates the cost of keyed state from the
model's.

Figures are printed and written to ``benchmarks/results/ml_throughput.json``.
Run: ``.venv/bin/python benchmarks/ml_throughput.py [--events 400000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


from node_throughput import (
    KeyedPassThrough,
    RunningMean,
    ensure,
    latency_run,
    measure_throughput,
)

import spanflow as sf
from spanflow.nats import EmbeddedNats
from spanflow.nats.streams import connect, ensure_stream
from spanflow.spark.session import build_session

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {
    "device": "string",
    "ts": "timestamp",
    "temperature": "double",
    "vibration": "double",
    "failed": "boolean",
}
DEVICES = 100
GOAL = 20_000


async def preload(url: str, stream: str, subject: str, n: int) -> None:
    nc = await connect(url)
    js = nc.jetstream()
    await ensure_stream(js, stream, [subject])
    base = 1_800_000_000.0
    futures = []
    for i in range(n):
        temperature = 20.0 + (i * 7 % 170) / 10.0
        record = {
            "device": f"dev-{i % DEVICES:03d}",
            "ts": datetime.fromtimestamp(base + i / 1000.0, UTC).isoformat(timespec="milliseconds"),
            "temperature": temperature,
            "vibration": 0.5 + (i * 13 % 50) / 100.0,
            "failed": temperature > 33.0,
        }
        futures.append(await js.publish_async(subject, orjson.dumps(record)))
        if len(futures) >= 4000:
            await asyncio.wait_for(asyncio.gather(*futures), 60)
            futures = []
    await asyncio.wait_for(asyncio.gather(*futures), 60)
    await nc.close()


def pipelines(batch_rows: int) -> dict[str, sf.Flow]:
    def keyed(name: str) -> sf.Stream:
        p = sf.Pipeline(f"bench-{name}", trigger=0)
        source = p.source(
            "ML_IN", schema=SCHEMA, event_time="ts", max_rows_per_batch=batch_rows, partitions=2
        )
        return source.key_by("device")

    fields = ["temperature", "vibration"]
    return {
        "keyed_baseline": keyed("baseline")
        .process(RunningMean, output_schema={"device": "string", "n": "long", "mean": "double"})
        .sink_jetstream("ML_BASE", subject="ml.base"),
        "detect_default": keyed("default")
        .detect_anomalies(fields, emit="anomalies")
        .sink_jetstream("ML_DEFAULT", subject="ml.default"),
        "detect_robust": keyed("robust")
        .detect_anomalies(fields, method="robust", emit="anomalies")
        .sink_jetstream("ML_ROBUST", subject="ml.robust"),
        "detect_hst": keyed("hst")
        .detect_anomalies(fields, method="hst", emit="anomalies")
        .sink_jetstream("ML_HST", subject="ml.hst"),
        "learn_logreg": keyed("learn")
        .learn("river:linear_model.LogisticRegression", features=fields, target="failed")
        .filter("learned < 0")  # keeps nothing: the sink would dominate, not the step
        .sink_jetstream("ML_LEARN", subject="ml.learn"),
        "score_onnx": keyed("score")
        .score("bench-model", prediction_type="boolean")
        .filter("model_version < 0")  # keeps nothing, as above
        .sink_jetstream("ML_SCORE", subject="ml.score"),
    }


def push_model(url: str) -> None:
    """A scikit-learn classifier over the two fields, as ONNX, in production."""
    import numpy as np
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    from spanflow.ml.model_store import ModelStore, with_store

    rng = np.random.default_rng(5)
    x = np.column_stack([rng.uniform(20, 37, 1000), rng.uniform(0.5, 1.0, 1000)])
    x = x.astype(np.float32)
    data = to_onnx(LogisticRegression().fit(x, x[:, 0] > 33), x[:1]).SerializeToString()

    async def work(store: ModelStore) -> None:
        await store.push("bench-model", data, format="onnx", features=["temperature", "vibration"])
        await store.promote("bench-model", 1)

    asyncio.run(with_store(url, work))


# -- added latency at a steady rate ----------------------------------------------------
def ml_reading(n: int) -> dict[str, Any]:
    """The n-th reading of the latency runs, stamped now (labels as in preload)."""
    temperature = 20.0 + (n * 7 % 170) / 10.0
    return {
        "device": f"dev-{n % DEVICES:03d}",
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "temperature": temperature,
        "vibration": 0.5 + (n * 13 % 50) / 100.0,
        "failed": temperature > 33.0,
    }


def latency_pipelines(stream: str) -> dict[str, sf.Flow]:
    fields = ["temperature", "vibration"]

    def head(name: str) -> sf.Stream:
        p = sf.Pipeline(f"lat-{name}", trigger=0)
        return (
            p.source(stream, schema=SCHEMA, event_time="ts", start="latest")
            .filter("temperature > -50")
            .map(published="_published")
        )

    def out(s: sf.Stream, name: str) -> sf.Flow:
        return s.sink_jetstream(f"LAT_{name.upper()}", subject=f"lat.{name}")

    return {
        "baseline": out(head("baseline"), "baseline"),
        "keyed_passthrough": out(
            head("keyed")
            .key_by("device")
            .process(
                KeyedPassThrough, output_schema={"device": "string", "published": "timestamp"}
            ),
            "keyed",
        ),
        "detect_default": out(
            head("detect").key_by("device").detect_anomalies(fields, warmup=20), "detect"
        ),
        "learn_logreg": out(
            head("learn")
            .key_by("device")
            .learn("river:linear_model.LogisticRegression", features=fields, target="failed"),
            "learn",
        ),
        "score_onnx": out(head("score").score("bench-model", prediction_type="boolean"), "score"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--batch-rows", type=int, default=100_000)
    ap.add_argument("--out", type=Path, default=RESULTS / "ml_throughput.json")
    ap.add_argument(
        "--cases",
        default="",
        help="comma-separated cases to run (default: all; the baseline always)",
    )
    ap.add_argument("--rate", type=int, default=2000, help="events/s of the latency runs")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per case")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spanflow-ml-bench-"))
    latency: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        spark = build_session(app_name="spanflow-ml-bench")
        push_model(server.url)
        if not args.skip_throughput:
            print(f"pre-loading {args.events:,} events …", flush=True)
            asyncio.run(preload(server.url, "ML_IN", "ml.in", args.events))
        chosen = {c for c in args.cases.split(",") if c} | {"keyed_baseline", "baseline"}
        for case, flow in pipelines(args.batch_rows).items():
            if (args.cases and case not in chosen) or args.skip_throughput:
                continue
            print(f"{case} …", flush=True)
            started = time.monotonic()
            results[case] = measure_throughput(
                spark, server.url, flow, args.events, work / f"ck-{case}"
            )
            rate = results[case]["events_per_s"]
            print(f"  {rate:,} events/s ({time.monotonic() - started:.0f} s)")
        if not args.skip_latency:
            asyncio.run(ensure(server.url, "LAT_IN", "lat.in"))
            for case, flow in latency_pipelines("LAT_IN").items():
                if args.cases and case not in chosen:
                    continue
                print(f"latency of {case} at {args.rate:,} events/s …", flush=True)
                latency[case] = latency_run(
                    spark,
                    server.url,
                    flow,
                    "lat.in",
                    args.rate,
                    args.seconds,
                    args.warmup,
                    work / f"lat-{case}",
                    make=ml_reading,
                )
                ms = latency[case]["latency_ms"]
                print(f"  p50 {ms['p50']:.0f} ms, p99 {ms['p99']:.0f} ms")
                print(f"  batch profile (mean ms): {latency[case]['profile']}")
        spark.stop()
    if args.cases or args.skip_latency or args.skip_throughput:
        args.out = args.out.with_name(f"{args.out.stem}_partial.json")
    base = results.get("keyed_baseline", {}).get("events_per_s")
    added = {
        case: round(1e6 / r["events_per_s"] - 1e6 / base, 1)
        for case, r in results.items()
        if case != "keyed_baseline" and r["events_per_s"] and base
    }
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count()},
        "events": args.events,
        "max_rows_per_batch": args.batch_rows,
        "throughput": results,
        "added_us_per_event_over_keyed_baseline": added,
        "latency_rate": args.rate,
        "latency": latency,
        "added_latency_ms_over_baseline": added_latency(latency),
        "targets": {
            "detect_default_events_per_s_at_least": GOAL,
            "detect_default_met": bool(
                results.get("detect_default", {}).get("events_per_s", 0) >= GOAL
            ),
        },
    }
    print(f"{'case':16} {'events/s':>10} {'µs/event over baseline':>24}")
    for case, r in results.items():
        print(f"{case:16} {r['events_per_s'] or 0:>10,} {added.get(case, 0.0):>24}")
    if latency:
        print(f"{'case':16} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'added p99':>10}")
        extra = out["added_latency_ms_over_baseline"]
        for case, r in latency.items():
            more = extra.get(case, {"p50": 0.0, "p99": 0.0})
            print(
                f"{case:16} {r['latency_ms']['p50']:>8.0f} {r['latency_ms']['p99']:>8.0f}"
                f" {more['p50']:>10.0f} {more['p99']:>10.0f}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {args.out}")


def added_latency(latency: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    base = latency.get("baseline")
    if base is None:
        return {}
    return {
        case: {
            q: round(r["latency_ms"][q] - base["latency_ms"][q], 1) for q in ("p50", "p95", "p99")
        }
        for case, r in latency.items()
        if case != "baseline"
    }


if __name__ == "__main__":
    main()
