"""Event-time windows (Spark's ``window``/``session_window`` over a watermark) and the
merge of per-site partial window aggregates."""

from __future__ import annotations

import functools

from pyspark.sql import Column, DataFrame, GroupedData
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spanflow.errors import CompileError
from spanflow.spark.compile.frame import (
    ALL,
    CompileContext,
    Frame,
    OutputMode,
    keyed_or_whole,
    spanflow_schema,
    updates_column,
    watermarked,
)
from spanflow.spark.compile.process import transform_keyed
from spanflow.spark.compile.registry import compiles
from spanflow.spark.compile.udf import UserFunction, reduce_udf, resolve
from spanflow.spark.keyed.builtins import TimeWindowReduce
from spanflow.spec.aggregates import parse_aggregate, partial_columns
from spanflow.spec.durations import spark_interval
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.io import PUBLISHED
from spanflow.spec.steps.windows import MergeStep, WindowStep

WINDOW_TIME = "_window_time"
"""The event time of a window's result (its end, less a microsecond)."""


def aggregate_column(name: str, text: str) -> Column:
    """One aggregate (``avg(t)``) as a Spark column named ``name``."""
    fn, field = parse_aggregate(text)
    if fn == "count":
        return F.count(F.lit(1) if field is None else F.col(field)).alias(name)
    assert field is not None  # parse_aggregate guarantees a field for these
    return {"sum": F.sum, "avg": F.avg, "min": F.min, "max": F.max}[fn](F.col(field)).alias(name)


def newest_published(df: DataFrame) -> list[Column]:
    """When the newest record of a group was stored by its source (``_published``):
    a window's or aggregate's result then times its way through the pipeline from
    there, as a record passed on does (the end-to-end latency of window outputs)."""
    return [F.max(PUBLISHED).alias(PUBLISHED)] if PUBLISHED in df.columns else []


def _partial_columns(name: str, text: str) -> list[Column]:
    """What one site contributes to an aggregate (see :func:`spanflow.spec.partial_columns`)."""
    fn, field = parse_aggregate(text)
    if fn != "avg":
        return [aggregate_column(name, text)]
    assert field is not None
    return [
        F.sum(F.col(field)).alias(f"{name}__sum"),
        F.count(F.col(field)).alias(f"{name}__count"),
    ]


@compiles(MergeStep)
def compile_merge(
    ctx: CompileContext, spec: PipelineSpec, step: MergeStep, inputs: list[Frame]
) -> Frame:
    """Fold the sites' partial aggregates of each (key, window) into the final values.

    The input is watermarked on ``window_end``, so a window is final once every site's
    partials have moved past it (Spark keeps the minimum watermark of the unioned
    sources)."""
    frame = watermarked(inputs[0], step.id)
    folds = {"sum": F.sum, "min": F.min, "max": F.max}
    columns = []
    for name, text in step.aggregates.items():
        for column, fold in partial_columns(name, text).items():
            if column not in frame.df.columns:
                raise CompileError(step.id, f"partial column {column!r} is missing from the input")
            columns.append(folds[fold](F.col(column)).alias(column))
    columns += newest_published(frame.df)
    grouped = frame.df.groupBy(*step.key, "window_start", "window_end").agg(*columns)
    finals = []
    for name, text in step.aggregates.items():
        fn, _ = parse_aggregate(text)
        if fn == "avg":
            finals.append(F.try_divide(F.col(f"{name}__sum"), F.col(f"{name}__count")).alias(name))
        else:
            finals.append(F.col(name))
    published = [PUBLISHED] if PUBLISHED in grouped.columns else []
    df = grouped.select(*step.key, "window_start", "window_end", *finals, *published)
    return Frame(df, key=step.key, mode="append")


def _windowed(df: DataFrame, key: tuple[str, ...], mode: OutputMode) -> Frame:
    if mode == "append":  # final results carry event time on to the next window
        return Frame(df, key=key, event_time=WINDOW_TIME, watermarked=True, mode=mode)
    return Frame(df.drop(WINDOW_TIME), key=key, mode=mode)


@compiles(WindowStep)
def compile_window(
    ctx: CompileContext, spec: PipelineSpec, step: WindowStep, inputs: list[Frame]
) -> Frame:
    frame = watermarked(inputs[0], step.id)
    assert frame.event_time is not None
    ts = F.col(frame.event_time)
    if step.kind == "session":
        assert step.gap is not None
        window = F.session_window(ts, spark_interval(step.gap))
    else:
        assert step.size is not None
        slide = spark_interval(step.slide) if step.slide else None
        window = F.window(ts, spark_interval(step.size), slide)
    grouped = frame.df.groupBy(*frame.key, window.alias("window"))
    # ``window_time`` keeps the watermark, so a later window can aggregate these results
    # (chained windows); sinks leave the underscore column out.
    bounds = [
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.window_time("window").alias(WINDOW_TIME),
    ]
    mode: OutputMode = "append" if step.emit == "final" else "update"
    if step.aggregates:
        if step.partial:
            columns = [c for n, t in step.aggregates.items() for c in _partial_columns(n, t)]
        else:
            columns = [aggregate_column(n, t) for n, t in step.aggregates.items()]
        if ctx.realtime:
            columns.append(updates_column())
        columns += newest_published(frame.df)
        df = grouped.agg(*columns)
        names = [c for c in df.columns if c not in frame.key and c != "window"]
        df = df.select(*frame.key, *bounds, *names)
        return _windowed(df, frame.key, mode)
    assert step.reduce is not None
    fn = resolve(step.reduce, step.id, ctx.functions)
    if step.kind == "session":
        return _collected_reduce(ctx, spec, step, frame, grouped, bounds[:2], fn, mode)
    return _incremental_reduce(ctx, spec, step, frame, fn, mode)


def _incremental_reduce(
    ctx: CompileContext,
    spec: PipelineSpec,
    step: WindowStep,
    frame: Frame,
    fn: UserFunction,
    mode: OutputMode,
) -> Frame:
    """Tumbling and sliding windows fold records into one accumulator per window as
    they arrive (keyed state), instead of collecting each window's records."""
    frame = keyed_or_whole(frame)  # one group for the whole stream without a key
    assert frame.event_time is not None and step.size is not None
    fields = spanflow_schema(step.id, frame.df.schema)
    output = {k: fields[k] for k in frame.key if k in fields}
    output.update({"window_start": "timestamp", "window_end": "timestamp"})
    output.update({k: v.rstrip("?") + "?" for k, v in fields.items() if k not in frame.key})
    final = mode == "append"
    if final:
        output[WINDOW_TIME] = "timestamp"
    factory = functools.partial(
        TimeWindowReduce,
        size=step.size,
        slide=step.slide,
        reduce=fn,
        event_time=frame.event_time,
        key_fields=frame.key,
        emit=step.emit,
    )
    df = transform_keyed(
        ctx,
        spec,
        step.id,
        frame,
        factory=factory,
        output=output,
        clock="event_time",
        output_event_time=WINDOW_TIME if final else None,
        mode=mode,
    )
    key = tuple(k for k in frame.key if k != ALL)
    if final:
        return Frame(df, key=key, event_time=WINDOW_TIME, watermarked=True, mode=mode)
    return Frame(df, key=key, mode=mode)


def _collected_reduce(
    ctx: CompileContext,
    spec: PipelineSpec,
    step: WindowStep,
    frame: Frame,
    grouped: GroupedData,
    bounds: list[Column],
    fn: UserFunction,
    mode: OutputMode,
) -> Frame:
    """Session windows can merge, and a fold cannot be merged: collect each session's
    records and fold them when it closes (a failing fold dead-letters the session)."""
    values = [c for c in frame.df.columns if not c.startswith("_") and c not in frame.key]
    collected = grouped.agg(F.collect_list(F.struct(*values)).alias("_rows"))
    collected = collected.select(*frame.key, *bounds, "_rows")
    value_fields = [f for f in frame.df.schema.fields if f.name in values]
    out_struct = StructType(
        [f for f in collected.schema.fields if f.name != "_rows"] + value_fields
    )
    udf = reduce_udf(
        fn,
        to_arrow_schema(out_struct, timezone="UTC"),
        [*frame.key, "window_start", "window_end"],
        url=ctx.nats_url,
        pipeline=spec.instance,
        step=step.id,
    )
    return Frame(collected.mapInArrow(udf, out_struct), key=frame.key, mode=mode)
