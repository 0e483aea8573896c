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

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spanflow.errors import CheckpointLost
from spanflow.nats.ledger import SinkLedger, lost_checkpoint
from spanflow.nats.streams import ensure_stream
from spanflow.spark.checkpoints import checkpoint_store
from spanflow.spark.connectors import BatchWriter, SinkContext, starts_realtime, writes
from spanflow.spark.connectors.jetstream.realtime import (
    MAX_IN_FLIGHT,
    share_identity,
    start_realtime_query,
)
from spanflow.spec import locations
from spanflow.spec.connectors import NoOptions

log = logging.getLogger(__name__)


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


def subject_pattern(subject: str) -> str:
    """``alerts.{device}`` → ``alerts.*``: the subjects a sink stream must capture."""
    return re.sub(r"\{[^}]*\}", "*", subject)


def _ensure_sink_stream(ctx: SinkContext) -> str:
    """The sink's stream, created (with the site's limits) if it is not there yet."""
    step, client = ctx.step, ctx.nats
    assert step.stream and step.subject and client is not None
    stream, wildcard = step.stream, subject_pattern(step.subject)
    client.run(lambda: ensure_stream(client.js, stream, [wildcard], retention=ctx.retention))
    return stream


@writes("jetstream")
class JetStreamWriter(BatchWriter):
    """Every micro-batch JetStream sink publishes from the driver, in the JVM
    (:class:`JetStreamSink`): no row crosses into Python.

    A Spark sink written in Python would cost per micro-batch a Python call to plan
    the write, one per partition (even an empty one) and one to commit; publishing
    each record through nats-py on the driver cost ≈110 to 160 µs a record. The
    ``foreachBatch`` also serves update-mode output, which Spark's Python sinks
    cannot take (docs/benchmarks.md)."""

    def __init__(self, ctx: SinkContext, sink_id: str, options: NoOptions) -> None:
        self.ctx = ctx
        self.streams = (_ensure_sink_stream(ctx),)
        self.ledger = self._ledger()
        if ctx.first_start:  # a restart in this process reuses what the first start checked
            self._refuse_lost_checkpoint()
        target = SinkTarget(ctx.pipeline, sink_id, ctx.step.subject or "", ctx.step.order_by)
        self.sink = JetStreamSink(ctx.spark, target, ctx.nats_url, ctx.epoch)

    def _ledger(self) -> SinkLedger:
        """The sink's ledger of published batches (nats/ledger.py), in the fences
        bucket of the server it writes to."""
        ctx, step = self.ctx, self.ctx.step
        assert ctx.nats is not None and ctx.fences is not None and step.stream and step.subject
        subjects = subject_pattern(step.subject)
        return SinkLedger(ctx.nats.nc, ctx.fences(), step.stream, subjects, ctx.checkpoint)

    def _refuse_lost_checkpoint(self) -> None:
        """A cluster fragment whose checkpoint vanished (a node's disk that no other node
        reads, a deleted store) would start from scratch without a word and read its
        sources again from the start: refuse, naming the fragment and the location."""
        ctx = self.ctx
        if ctx.fence is None or ctx.nats is None:
            return  # `spanflow run`: deleting the checkpoint is how a user starts over
        mark = ctx.nats.run(self.ledger.mark)
        offsets = locations.join(ctx.checkpoint, "offsets")
        if lost_checkpoint(mark, checkpoint_store.exists(ctx.spark, offsets)):
            assert mark is not None
            raise CheckpointLost(
                f"fragment {ctx.fence.fragment_id}: its checkpoint {ctx.checkpoint} has no "
                f"offsets, but sink {ctx.step.id!r} published up to batch {mark.batch} from "
                "it; not starting from scratch. Put the checkpoint back (or restore a "
                "savepoint), or resubmit the pipeline to start over."
            )

    def write(self, batch: DataFrame, batch_id: int) -> None:
        encoded = self.sink.encode(batch, batch_id)
        if not encoded.size:
            return
        client, ledger = self.ctx.nats, self.ledger
        assert client is not None
        self.ctx.check_fence()  # before the publish, and so before the checkpoint commit
        stored = client.run_patiently(
            lambda: ledger.published_before(batch_id, encoded.ids), f"{self.ctx.step.id}: ledger"
        )
        if stored:
            log.info(
                "%s: batch %d replayed: %d of its %d messages were published before",
                self.ctx.step.id,
                batch_id,
                len(stored),
                encoded.size,
            )
        published = publish_batch(self.sink, encoded, stored)
        client.run_patiently(
            lambda: ledger.after(batch_id, published.last_seq), f"{self.ctx.step.id}: ledger"
        )
        self.ctx.output.count(encoded.size, encoded.born_seconds(), time.time())

    def close(self) -> None:
        self.sink.close()


@starts_realtime("jetstream")
def start_in_real_time(ctx: SinkContext, df: DataFrame, name: str) -> StreamingQuery:
    """A JetStream sink in Real-Time Mode: the JVM's ``ForeachWriter`` publishes each
    row as it comes (:mod:`.realtime`)."""
    _ensure_sink_stream(ctx)
    return start_realtime_query(
        ctx.spark,
        df,
        name=name,
        checkpoint=ctx.checkpoint,
        nats_url=ctx.nats_url,
        pipeline=ctx.pipeline,
        sink_id=ctx.step.id,
        subject=ctx.step.subject or "",
        batch_seconds=ctx.step.realtime_batch,
        epoch=ctx.epoch,
    )
