"""Sinks to this node's own file system and terminal (declared in
:mod:`spanflow.spec.connectors.files`)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql.streaming import DataStreamWriter

from spanflow.spark.connectors import BatchWriter, SinkContext, writes
from spanflow.spec.connectors import NoOptions


@writes("parquet")
class ParquetWriter(BatchWriter):
    """Spark's own file sink: its ``_spark_metadata`` log makes each batch's files
    appear once to readers of the folder through Spark."""

    def __init__(self, ctx: SinkContext, sink_id: str, options: NoOptions) -> None:
        self.path = ctx.step.path or ""

    def attach(self, writer: DataStreamWriter) -> DataStreamWriter:
        return writer.format("parquet").option("path", self.path)


@writes("console")
class ConsoleWriter(BatchWriter):
    """Rows for people: the first ``show_limit`` of each batch to ``show_rows``."""

    def __init__(self, ctx: SinkContext, sink_id: str, options: NoOptions) -> None:
        self.ctx, self.sink_id = ctx, sink_id

    def write(self, batch: DataFrame, batch_id: int) -> None:
        show = self.ctx.show_rows
        rows = [r.asDict(recursive=True) for r in batch.limit(self.ctx.show_limit).collect()]
        if rows and show is not None:
            show(self.sink_id, batch_id, rows)
