"""Throughput of the model steps on one node, against a plain keyed processor in the
same run.

N events (100 devices; temperature, vibration and a label) are pre-loaded into
JetStream, then read by one pipeline per case, each a keyed step per device:

* ``keyed_baseline``: a keyed processor keeping a running mean (the node_throughput
  keyed case: the cost of Spark's transformWithState and the Python adapter);
* ``detect_robust``: ``detect_anomalies`` with the default robust method;
* ``detect_hst``: ``detect_anomalies(method="hst")`` (River's Half-Space Trees);
* ``learn_logreg``: ``learn("river:linear_model.LogisticRegression")``;
* ``score_onnx``: ``score`` with a registry model (a scikit-learn logistic regression
  as ONNX, run by onnxruntime once per Arrow batch).

Every case writes little (detection emits only anomalies; learning and scoring are
followed by a filter that keeps nothing), so the figures are of the steps, not of
publishing 400,000 results. Events/s are taken over the batches after the first.
The added cost per event of a case is ``1/rate(case) - 1/rate(baseline)``, in
microseconds.

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

from node_throughput import RunningMean, measure_throughput

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
        "detect_robust": keyed("robust")
        .detect_anomalies(fields, emit="anomalies")
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
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spanflow-ml-bench-"))
    results: dict[str, dict[str, Any]] = {}
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        spark = build_session(app_name="spanflow-ml-bench")
        print(f"pre-loading {args.events:,} events …", flush=True)
        asyncio.run(preload(server.url, "ML_IN", "ml.in", args.events))
        push_model(server.url)
        chosen = {c for c in args.cases.split(",") if c} | {"keyed_baseline"}
        for case, flow in pipelines(args.batch_rows).items():
            if args.cases and case not in chosen:
                continue
            print(f"{case} …", flush=True)
            started = time.monotonic()
            results[case] = measure_throughput(
                spark, server.url, flow, args.events, work / f"ck-{case}"
            )
            rate = results[case]["events_per_s"]
            print(f"  {rate:,} events/s ({time.monotonic() - started:.0f} s)")
        spark.stop()
    if args.cases:  # a partial run: print, keep the full run's file
        args.out = args.out.with_name("ml_throughput_partial.json")
    base = results["keyed_baseline"]["events_per_s"]
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
        "targets": {
            "detect_robust_events_per_s_at_least": GOAL,
            "detect_robust_met": bool(
                results.get("detect_robust", {}).get("events_per_s", 0) >= GOAL
            ),
        },
    }
    print(f"{'case':16} {'events/s':>10} {'µs/event over baseline':>24}")
    for case, r in results.items():
        print(f"{case:16} {r['events_per_s'] or 0:>10,} {added.get(case, 0.0):>24}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
