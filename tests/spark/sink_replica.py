"""A hot standby replica's sink writer in a process of its own, for a test to SIGKILL:
``python -m tests.spark.sink_replica KIND ADDRESS TARGET PIPELINE BATCHES FAULT_DIR``
(KIND ``kafka``: ADDRESS the bootstrap, TARGET the topic; ``postgres``: the DSN and the
table) writes batches 0..BATCHES-1 (100 ids each) and holds its last batch's
transaction open at the sink's fault point (armed by this script just before that
batch), where the test kills it.

Batches are Arrow tables handed over as Spark hands ``foreachBatch`` a frame
(``schema``, ``toArrow()``): no Spark session is started, so the process is up in a
second."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

import spanflow as sf
from spanflow.faults import FAULT_DIR_ENV
from spanflow.spark.connectors import BatchWriter, SinkContext
from spanflow.spark.connectors.kafka import KafkaWriter
from spanflow.spark.connectors.postgres import PostgresWriter

PG_PASSWORD_ENV = "SPANFLOW_TEST_PG_PASSWORD"  # tests.conftest's
FAULT_POINTS = {
    "kafka": "kafka-sink-open-transaction",
    "postgres": "postgres-sink-open-transaction",
}


class ArrowBatch:
    """Batch ``batch_id``'s rows: ids ``100 * batch_id`` to ``100 * batch_id + 99``."""

    schema = StructType([StructField("id", LongType())])

    def __init__(self, batch_id: int) -> None:
        self.ids = list(range(batch_id * 100, (batch_id + 1) * 100))

    def toArrow(self) -> pa.Table:
        return pa.table({"id": pa.array(self.ids, pa.int64())})


def flow(kind: str, address: str, target: str, pipeline: str) -> sf.Flow:
    source = sf.Pipeline(pipeline).source("S", schema={"id": "long"})
    if kind == "kafka":
        return source.sink_kafka(target, bootstrap=address)
    return source.sink_postgres(target, dsn=address, password_env=PG_PASSWORD_ENV)


def writer(kind: str, address: str, target: str, pipeline: str) -> BatchWriter:
    """A replica's writer (``SinkContext.replicated``), as a standby runner makes it."""
    step = flow(kind, address, target, pipeline).spec().sinks()[0]
    spark: Any = None  # the writers take frames' schema and Arrow tables only
    ctx = SinkContext(pipeline=pipeline, check_fence=lambda: None, step=step, spark=spark,
                      replicated=True)  # fmt: skip
    make = KafkaWriter if kind == "kafka" else PostgresWriter
    return make(ctx, step.id, step.options)  # type: ignore[arg-type]


def main(kind: str, address: str, target: str, pipeline: str, batches: str, faults: str) -> None:
    os.environ[FAULT_DIR_ENV] = faults
    w = writer(kind, address, target, pipeline)
    for batch_id in range(int(batches)):
        if batch_id == int(batches) - 1:
            (Path(faults) / f"{FAULT_POINTS[kind]}.arm").touch()
        w.write(ArrowBatch(batch_id), batch_id)  # type: ignore[arg-type]


if __name__ == "__main__":
    main(*sys.argv[1:])


def write_in_step(writers: list[BatchWriter], batches: list[Any]) -> list[BaseException]:
    """Each writer writes every batch in its own thread, all of them starting each batch
    at the same moment (two hot standby replicas at their worst); then closed. The
    errors raised."""
    import threading

    gate = threading.Barrier(len(writers))
    errors: list[BaseException] = []

    def replica(w: BatchWriter) -> None:
        try:
            for batch_id, frame in enumerate(batches):
                gate.wait(timeout=60)
                w.write(frame, batch_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for w in writers:
        w.close()
    return errors
