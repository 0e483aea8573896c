"""Sources: each read by its connector's reader (:mod:`spanflow.spark.connectors`),
watermarked where the source declares event time. (Sinks are written by the runner.)"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import functions as F

from spanflow.errors import CompileError
from spanflow.spark import connectors
from spanflow.spark.checkpoints.source_names import source_name
from spanflow.spark.compile.frame import CompileContext, Frame, with_watermark
from spanflow.spark.compile.registry import compiles
from spanflow.spark.connectors import SourceContext
from spanflow.spark.formats import ProtobufReader, spark_ddl
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.io import SourceStep

HEARTBEAT = "_heartbeat"


@compiles(SourceStep)
def compile_source(
    ctx: CompileContext, spec: PipelineSpec, step: SourceStep, inputs: list[Frame]
) -> Frame:
    from spanflow.spark.compile.pipeline import step_schema  # the graph walk uses this module

    schema = step_schema(ctx, step.schema_of) if step.schema_of else None
    if step.protobuf is not None:  # a bad descriptor set fails here, not in every batch
        try:
            ProtobufReader(step.protobuf.message, step.protobuf.descriptors)
        except Exception as exc:
            raise CompileError(step.id, f"protobuf {step.protobuf.message}: {exc}") from None
    fields = dict(step.schema_ if schema is None else schema)
    source = SourceContext(
        spark=ctx.spark,
        nats_url=ctx.nats_url,
        pipeline=spec.instance,
        query_token=f"{ctx.source_format}_{step.id}".replace("-", "_"),
        ddl=spark_ddl(fields, step.format),
        schema=fields,
        data_source=ctx.source_format,
        slot=ctx.slot,
        batch_plan=ctx.batch_plan,
        checkpoint=ctx.checkpoint,
        late_rules=ctx.late_rules.get(step.id, ()),
        source_name=source_name(step.id) if ctx.named_sources else None,
        passive=ctx.passive,
    )
    df = connectors.reader(step)(source, step)
    frame = Frame(df, key=(step.key,) if step.key else ())
    if step.event_time:
        frame = with_watermark(frame, spec, step.event_time, step.max_out_of_orderness)
        # Heartbeat rows only tell the watermark this source's time (see the reader).
        # The filter names the event-time column so that Spark does not push it below
        # the watermark (it pushes predicates that do not), where the watermark would
        # never see the row; heartbeats always have an event time.
        beat = F.col(HEARTBEAT) & F.col(step.event_time).isNotNull()
        frame = replace(frame, df=frame.df.filter(~beat))
    return replace(frame, df=frame.df.drop(HEARTBEAT))
