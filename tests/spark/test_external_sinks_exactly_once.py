"""Kafka in, every external sink out, exactly once through crashes: one ``spanflow
run`` reads readings from a Kafka topic of three partitions and writes them to
PostgreSQL (plain inserts), MongoDB (the emulator), S3 (rclone) and another Kafka
topic at once; it is SIGKILLed mid-stream twice and restarted from its checkpoints.
Each system then holds every reading once: a batch read twice from Kafka, or written
twice, would show as duplicates."""

from __future__ import annotations

import os
from collections import Counter

import psycopg
import pytest

from tests.conftest import PG_PASSWORD_ENV, S3_KEY_ENV, S3_SECRET_ENV
from tests.helpers import sigkill_twice_then_finish
from tests.kafka_helpers import create_topic, produce, read_values
from tests.spark import sink_cases
from tests.spark.test_mongodb import docs
from tests.spark.test_s3 import committed_rows

pytestmark = pytest.mark.slow

N = 2400


def _pg_ids(dsn: str, table: str) -> list[int]:
    with psycopg.connect(dsn, password=os.environ[PG_PASSWORD_ENV]) as conn:
        try:
            return [i for (i,) in conn.execute(f"SELECT id FROM {table}").fetchall()]
        except psycopg.errors.UndefinedTable:
            return []


def test_kafka_in_every_external_sink_out_exactly_once_across_sigkill_restarts(
    nats_url, postgres, mongodb, s3, kafka, tmp_path, uid
):
    bucket, source, topic = f"eo-{uid}", f"in-eo-{uid}", f"out-eo-{uid}"
    s3.make_bucket(bucket)
    create_topic(kafka, source, partitions=3)
    create_topic(kafka, topic, partitions=2)
    records = [
        {"id": i, "device": "abcd"[i % 4], "v": float(i), "ts": sink_cases.BASE + i}
        for i in range(N)
    ]
    produce(kafka, source, records, key="device")
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"""
name: xeo-{uid}
trigger: 0s
sources:
  - {{id: in, type: kafka, topic: {source}, bootstrap: "{kafka}", max_rows_per_batch: 150,
     schema: {{id: long, device: string, v: double, ts: timestamp}}, key: device,
     to: [rows, docs, objects, topic]}}
sinks:
  - {{id: rows, type: postgres, dsn: "{postgres}", password_env: {PG_PASSWORD_ENV},
     table: eo_{uid}}}
  - {{id: docs, type: mongodb, uri: "{mongodb}", database: eo{uid}, collection: rows}}
  - {{id: objects, type: s3, bucket: {bucket}, endpoint: "{s3.endpoint}", format: jsonl,
     access_key_env: {S3_KEY_ENV}, secret_key_env: {S3_SECRET_ENV}, partition_by: [device]}}
  - {{id: topic, type: kafka, topic: {topic}, bootstrap: "{kafka}", key: device}}
""")
    outputs = {
        "postgres": lambda: _pg_ids(postgres, f"eo_{uid}"),
        "mongodb": lambda: [d["id"] for d in docs(mongodb, f"eo{uid}", "rows")],
        "s3": lambda: [r["id"] for r in committed_rows(s3, bucket, f"xeo-{uid}/objects")],
        "kafka": lambda: [r["id"] for r in read_values(kafka, topic)],
    }
    log = sigkill_twice_then_finish(
        pipeline, nats_url, tmp_path, lambda: min(len(get()) for get in outputs.values()), N
    )
    expected = Counter(r["id"] for r in records)
    for system, get in outputs.items():
        assert Counter(get()) == expected, f"{system}: {log.read_text()[-2000:]}"
