"""The micro-batch JetStream sink: a thin shell over the JVM's ``BatchSink``.

Every JetStream sink of a micro-batch query publishes from the driver, in a
``foreachBatch``: the JVM collects the batch, encodes each row as JSON and publishes it
with pipelined acks (``dev.spanflow.realtime.BatchSink``, in the real-time jar). No row
crosses into Python: the driver publishing each record through nats-py cost ≈110 to 160 µs
a record (6,000 to 9,000 records/s), the JVM a few µs (docs/benchmarks.md).

Exactly once: a message's ``Nats-Msg-Id`` is ``pipeline:sink:batch:driver:digest:n``
(the digest of its payload; ``n``, its occurrence among equal payloads of the batch).
A replayed batch re-creates the same ids, which JetStream drops within its duplicate
window; beyond it the sink's ledger (:mod:`spanflow.nats.ledger`) names the ids the
stream already holds and :func:`publish_batch` skips them.

Only strings, a handle and a byte string cross py4j per batch: the batch's Java
``Dataset`` goes in, a count and the rows' source store times (for the end-to-end
latency) come back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession

from spanflow.spark.realtime import MAX_IN_FLIGHT, share_identity


@dataclass(frozen=True)
class SinkTarget:
    """Where and how a sink publishes."""

    pipeline: str
    step: str
    subject: str
    order_by: str | None = None


@dataclass(frozen=True)
class Published:
    """What a publish stored: messages sent, how many JetStream flagged duplicate, and
    the highest stream sequence among the acks (0: nothing published)."""

    sent: int
    duplicates: int
    last_seq: int


@dataclass(frozen=True)
class EncodedBatch:
    """A batch's messages, encoded and held by the JVM until published."""

    handle: Any
    size: int

    def ids(self) -> list[str]:
        """The messages' ``Nats-Msg-Id`` (one call across; only a replay needs them)."""
        return str(self.handle.idsText()).split("\n") if self.size else []

    def born_seconds(self) -> np.ndarray:
        """When each row's source stored its record (Unix seconds), for the rows that
        still carry ``_published``."""
        raw = bytes(self.handle.bornMicros())
        return np.frombuffer(raw, dtype="<i8").astype(np.float64) / 1e6


class JetStreamSink:
    """One JetStream sink's JVM publisher, kept for the life of its query (one NATS
    connection across batches)."""

    def __init__(
        self, spark: SparkSession, target: SinkTarget, nats_url: str, epoch: int | None
    ) -> None:
        share_identity(spark)  # credentials and TLS, as the real-time writer has them
        jvm: Any = spark._jvm
        self._sink = jvm.dev.spanflow.realtime.BatchSink(
            nats_url,
            target.pipeline,
            target.step,
            target.subject,
            target.order_by or "",
            "" if epoch is None else str(epoch),
            MAX_IN_FLIGHT,
        )

    def encode(self, batch: DataFrame, batch_id: int) -> EncodedBatch:
        """Collect ``batch`` to the driver's JVM and encode it (nothing published yet)."""
        handle = self._sink.encode(batch._jdf, batch_id)
        return EncodedBatch(handle, int(handle.size()))

    def close(self) -> None:
        self._sink.close()


def publish_batch(sink: JetStreamSink, batch: EncodedBatch, skip: set[str]) -> Published:
    """Publish ``batch`` but the ids in ``skip``; returns once every message is acked
    (raises when one is not: Spark then does not commit the batch)."""
    answer = str(sink._sink.publish(batch.handle, "\n".join(skip)))
    sent, duplicates, last_seq = (int(x) for x in answer.split())
    return Published(sent, duplicates, last_seq)
