"""Start a sink's query in Spark's Real-Time Mode, over the JVM JetStream source and sink.

Real-Time Mode runs long batches (minutes) whose tasks read continuously, so a record
reaches the sink in milliseconds instead of waiting for the next micro-batch. Spark
allows it only for JVM sources and sinks: ``spanflow_jetstream_rt`` (source) and
``JetStreamWriter`` (a JVM ``ForeachWriter``), both in the jar of
:mod:`spanflow.spark.connectors.jetstream.jvm_jar`, which the session loads at start.

Slots: every task of a real-time batch runs for the whole batch. A stateless query
holds one task slot (the source's one partition; the sink writes in the same task); a
stateful one also one per shuffle partition, which real-time queries set to
:data:`SHUFFLE_PARTITIONS`. Slots are logical, so the session runs ``local[N]`` with N
above the core count (:func:`spanflow.spark.session.build_session`'s
``realtime_slots``); other queries only get what real-time queries leave.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import orjson
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spanflow.errors import SpanflowError
from spanflow.protocol.metrics import Histogram
from spanflow.spark.connectors.jetstream.jvm_jar import jar_path
from spanflow.spec.durations import spark_interval

SOURCE_FORMAT = "spanflow_jetstream_rt"
SHUFFLE_PARTITIONS = 1
"""Shuffle partitions of a stateful real-time query: each holds a slot for the whole
batch, so one keeps a per-key aggregation at two slots (frozen in its checkpoint)."""
MAX_IN_FLIGHT = 2000
"""Publishes a sink task keeps waiting for their JetStream acks."""

_start_lock = threading.Lock()


def session_conf() -> dict[str, str]:
    """What a session needs from its start to run real-time queries."""
    return {
        "spark.jars": str(jar_path()),
        # Stateful real-time queries pass rows between stages through a streaming
        # shuffle whose writer waits up to this long to fill a buffer (default 50 ms: a
        # p50 of ≈30 ms on its own).
        "spark.shuffle.streaming.networkBufferMaxWaitTimeMs": "1",
    }


def share_identity(spark: SparkSession) -> None:
    """Tell the JVM client which secrets and role this process uses (locked mode,
    docs/security.md): system properties, since the JVM's environment was fixed when it
    started. Only the directory and the role cross over; the client reads the files."""
    from spanflow.security.secrets import ROLE_ENV, SECRETS_ENV
    from spanflow.spark.jvm.jars import JNATS, why_missing

    missing = why_missing(JNATS.name)
    if missing:  # every JVM part that talks to NATS needs it: say so before a NoClassDefFound
        raise SpanflowError(f"the NATS Java client (jnats) could not be loaded: {missing}")
    jvm: Any = spark._jvm
    system = jvm.java.lang.System
    root = os.environ.get(SECRETS_ENV, "")
    if root:
        system.setProperty("spanflow.secrets", root)
        system.setProperty("spanflow.role", os.environ.get(ROLE_ENV) or "agent")
    else:
        system.clearProperty("spanflow.secrets")


def start_realtime_query(
    spark: SparkSession,
    df: DataFrame,
    *,
    name: str,
    checkpoint: str,
    nats_url: str,
    pipeline: str,
    sink_id: str,
    subject: str,
    batch_seconds: float,
    epoch: int | None = None,
) -> StreamingQuery:
    """Start ``df`` in Real-Time Mode, publishing each row to JetStream from the JVM."""
    jvm: Any = spark._jvm
    share_identity(spark)
    writer = jvm.dev.spanflow.realtime.JetStreamWriter(
        nats_url, pipeline, sink_id, subject, "" if epoch is None else str(epoch), MAX_IN_FLIGHT
    )
    stream_writer = (
        df.writeStream.queryName(name)
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(realTime=spark_interval(batch_seconds))  # type: ignore[call-overload]
    )
    with _start_lock:
        # The shuffle partitions a stateful query starts with are frozen into its
        # checkpoint; set them for this start only.
        previous = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        try:
            jquery = stream_writer._jwrite.foreach(writer).start()
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", previous or "2")
    return StreamingQuery(jquery)


@dataclass(frozen=True)
class LiveRead:
    """What a real-time query's sources have read so far (cumulative over its batches),
    seen while a batch runs: Real-Time Mode reports progress only when a batch ends."""

    records: int
    pending: int
    """Messages stored but not yet read: the query's backlog."""
    last_published_ms: int
    """When the newest message read was stored (epoch ms)."""
    at: float
    """``time.monotonic()`` of the reading."""


def live_read(spark: SparkSession, query_id: str) -> LiveRead | None:
    """The JVM readers' live counters for ``query_id``, or None before any has read."""
    jvm: Any = spark._jvm
    raw = orjson.loads(str(jvm.dev.spanflow.realtime.LiveProgress.snapshot(query_id)))
    if not raw.get("readers"):
        return None
    return LiveRead(
        int(raw["records"]), int(raw["pending"]), int(raw["last_published_ms"]), time.monotonic()
    )


def live_written(spark: SparkSession, query_id: str) -> tuple[int, Histogram] | None:
    """What a real-time query's JetStream sink published so far (cumulative over its
    batches) and the end-to-end latency of those records, or None before it wrote."""
    jvm: Any = spark._jvm
    raw = orjson.loads(str(jvm.dev.spanflow.realtime.LiveProgress.written(query_id)))
    if "records" not in raw:
        return None
    return int(raw["records"]), Histogram(counts=raw["counts"], sum=float(raw["sum"]))


def forget_live_read(spark: SparkSession, query_id: str) -> None:
    """Drop a stopped query's counters from the JVM."""
    jvm: Any = spark._jvm
    jvm.dev.spanflow.realtime.LiveProgress.forget(query_id)


def rates(before: LiveRead | None, now: LiveRead) -> tuple[float, float]:
    """(input, processed) rows/s between two readings: processed is what the readers
    took; input is that plus the backlog's growth, so input above processed means the
    query falls behind, as a micro-batch's progress would say."""
    if before is None or now.at <= before.at or now.records < before.records:
        return 0.0, 0.0
    seconds = now.at - before.at
    processed = (now.records - before.records) / seconds
    grown = (now.pending - before.pending) / seconds
    return max(0.0, processed + grown), processed
