"""Keyed built-ins that Spark's own operators cover: de-duplication within a watermark
and running aggregates per key."""

from __future__ import annotations

from dataclasses import replace

from spanflow.spark.compile.frame import (
    CompileContext,
    Frame,
    require_columns,
    updates_column,
    watermarked,
)
from spanflow.spark.compile.registry import compiles
from spanflow.spark.compile.windows import aggregate_column
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.keyed import AggregateStep, DeduplicateStep


@compiles(DeduplicateStep)
def compile_deduplicate(
    ctx: CompileContext, spec: PipelineSpec, step: DeduplicateStep, inputs: list[Frame]
) -> Frame:
    frame = watermarked(inputs[0], step.id)
    require_columns(frame, step.id, step.key, "key")
    if ctx.realtime:
        # Real-Time Mode has no dropDuplicatesWithinWatermark. With the event time in the
        # key, a resent record (same key, same time) is dropped, and the watermark clears
        # state; a record with the same key and another time passes (documented).
        assert frame.event_time is not None
        keys = list(dict.fromkeys([*step.key, frame.event_time]))
        return replace(frame, df=frame.df.dropDuplicates(keys))
    return replace(frame, df=frame.df.dropDuplicatesWithinWatermark(list(step.key)))


@compiles(AggregateStep)
def compile_aggregate(
    ctx: CompileContext, spec: PipelineSpec, step: AggregateStep, inputs: list[Frame]
) -> Frame:
    """``groupBy(key).agg(...)`` in update mode: a key's new values after each batch."""
    (up,) = inputs
    columns = [aggregate_column(n, t) for n, t in step.aggregates.items()]
    if ctx.realtime:
        columns.append(updates_column())
    df = up.df.groupBy(*up.key).agg(*columns)
    return Frame(df, key=up.key, mode="update")
