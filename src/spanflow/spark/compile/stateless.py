"""Record-at-a-time steps: SQL ones stay in the JVM, Python ones run as ``mapInArrow``."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import functions as F

from spanflow.errors import CompileError
from spanflow.spark.compile.frame import (
    REALTIME_ID_COLUMNS,
    CompileContext,
    Frame,
    python_step,
    require_columns,
    with_watermark,
)
from spanflow.spark.compile.registry import compiles
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.io import PUBLISHED
from spanflow.spec.steps.stateless import (
    EventTimeStep,
    FilterStep,
    FlatMapStep,
    KeyByStep,
    MapStep,
    SelectStep,
    UnionStep,
)


@compiles(FilterStep)
def compile_filter(
    ctx: CompileContext, spec: PipelineSpec, step: FilterStep, inputs: list[Frame]
) -> Frame:
    (up,) = inputs
    if step.function:
        return python_step(ctx, spec, step.id, "filter", step.function, up, None)
    return replace(up, df=up.df.filter(F.expr(step.where or "true")))


@compiles(SelectStep)
def compile_select(
    ctx: CompileContext, spec: PipelineSpec, step: SelectStep, inputs: list[Frame]
) -> Frame:
    (up,) = inputs
    df = up.df.selectExpr(*step.columns)
    if ctx.realtime:  # keep what message ids and latency come from (unpublished)
        hidden = (*REALTIME_ID_COLUMNS, PUBLISHED)
        kept = [c for c in hidden if c in up.df.columns and c not in df.columns]
        if kept:
            df = up.df.selectExpr(*step.columns, *kept)
    return replace(up, df=df)


@compiles(MapStep)
def compile_map(
    ctx: CompileContext, spec: PipelineSpec, step: MapStep, inputs: list[Frame]
) -> Frame:
    (up,) = inputs
    if step.function:
        return python_step(ctx, spec, step.id, "map", step.function, up, step.schema_)
    df = up.df
    for name, expression in (step.columns or {}).items():
        df = df.withColumn(name, F.expr(expression))
    return replace(up, df=df)


@compiles(FlatMapStep)
def compile_flat_map(
    ctx: CompileContext, spec: PipelineSpec, step: FlatMapStep, inputs: list[Frame]
) -> Frame:
    return python_step(ctx, spec, step.id, "flat_map", step.function, inputs[0], step.schema_)


@compiles(KeyByStep)
def compile_key_by(
    ctx: CompileContext, spec: PipelineSpec, step: KeyByStep, inputs: list[Frame]
) -> Frame:
    (up,) = inputs
    require_columns(up, step.id, step.key, "key")
    return replace(up, key=step.key)


@compiles(EventTimeStep)
def compile_event_time(
    ctx: CompileContext, spec: PipelineSpec, step: EventTimeStep, inputs: list[Frame]
) -> Frame:
    (up,) = inputs
    if step.field not in up.df.columns:
        raise CompileError(step.id, f"unknown field {step.field!r}; columns: {up.df.columns}")
    if up.watermarked:
        raise CompileError(
            step.id, f"event time is already set ({up.event_time!r}); set it once per stream"
        )
    frame = replace(up, df=up.df.withColumn(step.field, F.col(step.field).cast("timestamp")))
    return with_watermark(frame, spec, step.field, step.max_out_of_orderness)


@compiles(UnionStep)
def compile_union(
    ctx: CompileContext, spec: PipelineSpec, step: UnionStep, inputs: list[Frame]
) -> Frame:
    first = inputs[0]
    df = first.df
    for other in inputs[1:]:
        if sorted(other.df.columns) != sorted(df.columns) and not step.allow_missing:
            raise CompileError(
                step.id,
                f"inputs have different columns: {sorted(df.columns)} and "
                f"{sorted(other.df.columns)}",
            )
        df = df.unionByName(other.df, allowMissingColumns=step.allow_missing)
    if any(f.mode != "append" for f in inputs):
        raise CompileError(step.id, "a union needs append inputs (final windows, not updates)")
    keys = {f.key for f in inputs}
    times = {f.event_time for f in inputs}
    return Frame(
        df,
        key=first.key if len(keys) == 1 else (),
        event_time=first.event_time if len(times) == 1 else None,
        watermarked=all(f.watermarked for f in inputs) and len(times) == 1,
    )
