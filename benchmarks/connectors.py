"""Connector throughput: the same window pipeline over Kafka and over JetStream.

Measured in one run, on this machine, so the ratio holds when absolute figures do not:
N events (JSON readings of 100 devices) are pre-loaded into a Kafka topic of two
partitions on a local Apache Kafka broker (KRaft, one node) and into a JetStream
stream; then the pipeline

    source → parse (JSON) → filter → 10 s tumbling window count per device → sink

runs once with a Kafka source and a Kafka sink (one transaction per micro-batch) for each
Kafka reader (spanflow's Python reader, the default, and Spark's own connector) and
once with a JetStream source and sink (two read tasks), each over every event;
events/s over the batches after the first (the first pays Python worker start-up).
Sinks alone: the JetStream events → filter → a PostgreSQL table (local PostgreSQL
15, plain inserts, one transaction per micro-batch), and → Parquet objects on a
local S3 server (rclone serve s3, partitioned by nothing), rows/s written.

The broker runs on the same two cores as Spark (a JVM with a small heap): a cluster
of brokers on machines of their own would take nothing from the pipeline.

Figures are printed and written to ``benchmarks/results/connectors.json``.
Run: ``.venv/bin/python benchmarks/connectors.py [--events 500000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from node_throughput import DEVICES, SCHEMA, measure_throughput, preload, window_pipeline

import spanflow as sf
from spanflow.local.kafka_broker import LocalKafka
from spanflow.local.postgres import LocalPostgres
from spanflow.local.s3 import LocalS3
from spanflow.nats import EmbeddedNats
from spanflow.spark.session import build_session

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 2
PG_PASSWORD_ENV = "SPANFLOW_BENCH_PG_PASSWORD"


def reading(i: int) -> bytes:
    """The i-th reading, as node_throughput's preload writes it."""
    base = 1_800_000_000.0
    return orjson.dumps(
        {
            "device": f"dev-{i % DEVICES:03d}",
            "ts": datetime.fromtimestamp(base + i / 1000.0, UTC).isoformat(timespec="milliseconds"),
            "temperature": 20.0 + (i % 170) / 10.0,
        }
    )


def preload_kafka(bootstrap: str, topic: str, n: int) -> float:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name in (topic, f"{topic}-out-spark", f"{topic}-out-python"):
        for future in admin.create_topics([NewTopic(name, num_partitions=PARTITIONS)]).values():
            future.result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "partitioner": "murmur2_random"})  # fmt: skip
    start = time.perf_counter()
    for i in range(n):
        key = f"dev-{i % DEVICES:03d}".encode()
        while True:
            try:
                producer.produce(topic, reading(i), key=key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0
    elapsed = time.perf_counter() - start
    return n / elapsed


def kafka_pipeline(bootstrap: str, topic: str, batch_rows: int, reader: str) -> sf.Flow:
    return (
        sf.Pipeline(f"bench-kafka-{reader}", trigger=0)
        .source_kafka(
            topic,
            bootstrap=bootstrap,
            reader=reader,
            schema=SCHEMA,
            event_time="ts",
            max_out_of_orderness="2s",
            max_rows_per_batch=batch_rows,
        )
        .filter("temperature > -50")
        .key_by("device")
        .window(tumbling="10s")
        .aggregate(n="count")
        .sink_kafka(f"{topic}-out-{reader}", bootstrap=bootstrap, key="device")
    )


def postgres_pipeline(dsn: str, batch_rows: int) -> sf.Flow:
    return (
        sf.Pipeline("bench-postgres", trigger=0)
        .source("BENCH_IN", schema=SCHEMA, max_rows_per_batch=batch_rows, partitions=PARTITIONS)
        .filter("temperature > -50")
        .sink_postgres("bench_rows", dsn=dsn, password_env=PG_PASSWORD_ENV)
    )


def s3_pipeline(endpoint: str, batch_rows: int) -> sf.Flow:
    return (
        sf.Pipeline("bench-s3", trigger=0)
        .source("BENCH_IN", schema=SCHEMA, max_rows_per_batch=batch_rows, partitions=PARTITIONS)
        .filter("temperature > -50")
        .sink_s3("bench", endpoint=endpoint)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=500_000)
    ap.add_argument("--batch-rows", type=int, default=100_000, help="source max rows per batch")
    ap.add_argument("--out", type=Path, default=RESULTS / "connectors.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spanflow-bench-"))
    with (
        EmbeddedNats(work / "nats", sync_always=False) as server,
        LocalKafka() as kafka,
        LocalPostgres() as postgres,
        LocalS3() as s3,
    ):
        os.environ[PG_PASSWORD_ENV] = postgres.password
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = (
            s3.access_key,
            s3.secret_key,
        )
        s3.make_bucket("bench")
        spark = build_session(app_name="spanflow-bench-connectors")
        print(f"pre-loading {args.events:,} events into JetStream and Kafka …", flush=True)
        js_rate = asyncio.run(preload(server.url, "BENCH_IN", "bench.in", args.events))
        kafka_rate = preload_kafka(kafka.bootstrap, "bench-in", args.events)
        flows = {
            "jetstream": window_pipeline("bench-js", "BENCH_IN", "BENCH_WIN", emit="final",
                                         partitions=PARTITIONS, batch_rows=args.batch_rows),
            "kafka": kafka_pipeline(kafka.bootstrap, "bench-in", args.batch_rows, "python"),
            "kafka_spark_reader": kafka_pipeline(kafka.bootstrap, "bench-in", args.batch_rows,
                                                 "spark"),
            "postgres_sink": postgres_pipeline(postgres.dsn, args.batch_rows),
            "s3_sink": s3_pipeline(s3.endpoint, args.batch_rows),
        }  # fmt: skip
        results: dict[str, dict[str, Any]] = {}
        for case, flow in flows.items():
            print(f"throughput ({case}) …", flush=True)
            thr = measure_throughput(spark, server.url, flow, args.events, work / f"ck-{case}")
            results[case] = thr
            rate = thr["events_per_s"]
            print(f"  {rate:,} events/s over {thr['batches'] - 1} batches" if rate else "  too few")
        spark.stop()
    ratio = (
        results["kafka"]["events_per_s"] / results["jetstream"]["events_per_s"]
        if results["kafka"]["events_per_s"] and results["jetstream"]["events_per_s"]
        else None
    )
    print(f"kafka / jetstream: {ratio:.2f}" if ratio else "kafka / jetstream: not measured")
    python_reader, spark_reader = (
        results[c]["events_per_s"] for c in ("kafka", "kafka_spark_reader")
    )
    readers = spark_reader / python_reader if spark_reader and python_reader else None
    print(f"Spark's Kafka reader / the Python reader: {readers:.2f}" if readers else "")
    out = {
        "benchmark": "connectors",
        "machine": platform.platform(),
        "cores": os.cpu_count(),
        "events": args.events,
        "max_rows_per_batch": args.batch_rows,
        "preload_per_s": {"jetstream": round(js_rate), "kafka": round(kafka_rate)},
        "throughput": results,
        "kafka_over_jetstream": ratio,
        "spark_reader_over_python_reader": readers,
    }
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
