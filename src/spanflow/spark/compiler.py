"""Compile a pipeline spec into Structured Streaming DataFrames, one per sink.

Spark idioms stay in this module: SQL expression strings go straight to the JVM
(``expr``, ``selectExpr``) with no Python UDF; Python functions become ``mapInArrow``
functions; windows become ``window``/``session_window`` over a watermark; keyed
state lives in RocksDB (see :mod:`spanflow.spark.session`). Errors from Spark's
analyser are re-raised naming the step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spanflow.errors import CompileError
from spanflow.spark.formats import spark_ddl
from spanflow.spark.functions import UserFunction, arrow_udf, reduce_udf, resolve
from spanflow.spark.jetstream import FORMAT_NAME
from spanflow.spec import (
    AverageStep,
    CountStep,
    DeduplicateStep,
    EventTimeStep,
    FilterStep,
    FlatMapStep,
    ForwardStep,
    KeyByStep,
    MapStep,
    MergeStep,
    PipelineSpec,
    SelectStep,
    SinkStep,
    SourceStep,
    Step,
    SumStep,
    UnionStep,
    WindowStep,
    parse_aggregate,
    partial_columns,
)
from spanflow.spec.durations import spark_interval
from spanflow.spec.schema import SPARK_TYPES_BY_NAME, field_type

OutputMode = Literal["append", "update"]


@dataclass(frozen=True)
class Frame:
    """A DataFrame plus what the spec knows about it at this point of the pipeline."""

    df: DataFrame
    key: tuple[str, ...] = ()
    event_time: str | None = None
    watermarked: bool = False
    mode: OutputMode = "append"


@dataclass(frozen=True)
class CompiledSink:
    sink: SinkStep
    df: DataFrame
    mode: OutputMode


@dataclass(frozen=True)
class CompileContext:
    spark: SparkSession
    nats_url: str
    functions: Mapping[str, UserFunction]
    source_format: str = FORMAT_NAME
    plan: PipelineSpec | None = None
    """The planned pipeline a fragment was cut from: sources with ``schema_of`` take
    the schema of that step in it."""
    slot: tuple[int, int] = (0, 0)
    """(phase, interval) in ms: when in each interval the query's sources start a batch
    (:mod:`spanflow.spark.stagger`)."""


def compile_pipeline(
    spark: SparkSession,
    spec: PipelineSpec,
    *,
    nats_url: str,
    functions: Mapping[str, UserFunction] | None = None,
    source_format: str = FORMAT_NAME,
    plan: PipelineSpec | None = None,
    slot: tuple[int, int] = (0, 0),
) -> list[CompiledSink]:
    """One streaming DataFrame per sink (each becomes its own query).

    ``source_format`` is the registered name sources read through (see
    :func:`spanflow.spark.jetstream.register_isolated`).
    """
    ctx = CompileContext(spark, nats_url, functions or {}, source_format, plan, slot)
    frames = _compile_frames(ctx, spec, list(spec.topological()))
    out: list[CompiledSink] = []
    for step in spec.sinks():
        frame = frames[step.inputs[0]]
        if step.kind == "parquet" and frame.mode != "append":
            raise CompileError(
                step.id, "a parquet sink needs append output; use emit='final' windows"
            )
        out.append(CompiledSink(step, frame.df, frame.mode))
    return out


def _compile_frames(ctx: CompileContext, spec: PipelineSpec, steps: list[Step]) -> dict[str, Frame]:
    frames: dict[str, Frame] = {}
    for step in steps:
        if isinstance(step, SinkStep):
            continue
        try:
            if isinstance(step, UnionStep):
                frames[step.id] = _union(step, [frames[i] for i in step.inputs])
            else:
                upstream = frames[step.inputs[0]] if step.inputs else None
                frames[step.id] = _compile_step(ctx, spec, step, upstream)
            frames[step.id].df.schema  # noqa: B018 - force analysis so errors name this step
        except CompileError:
            raise
        except PySparkException as exc:
            raise CompileError(step.id, _short(exc)) from None
    return frames


def _ancestors(spec: PipelineSpec, step_id: str) -> list[Step]:
    """``step_id`` and every step it reads from, inputs first."""
    wanted: set[str] = set()
    pending = [step_id]
    while pending:
        sid = pending.pop()
        if sid not in wanted:
            wanted.add(sid)
            pending.extend(spec.step(sid).inputs)
    return [s for s in spec.topological() if s.id in wanted]


def step_schema(ctx: CompileContext, step_id: str) -> dict[str, str]:
    """The record schema (spanflow types) of one step of the planned pipeline: what a
    fragment downstream of a cut reads. Analysis only; nothing is started."""
    if ctx.plan is None:
        raise CompileError(step_id, "a source with schema_of needs the planned pipeline")
    try:
        ctx.plan.step(step_id)
    except KeyError:
        raise CompileError(step_id, "schema_of names a step the pipeline does not have") from None
    frames = _compile_frames(replace(ctx, plan=None), ctx.plan, _ancestors(ctx.plan, step_id))
    return spanflow_schema(step_id, frames[step_id].df.schema)


def spanflow_schema(step_id: str, struct: StructType) -> dict[str, str]:
    """Spark columns → a spanflow schema, so records can cross sites as JSON.

    Metadata columns (``_subject``, ``_seq``, ...) stay behind: the reading side adds
    its own, as every source does."""
    out: dict[str, str] = {}
    for f in struct.fields:
        if f.name.startswith("_"):
            continue
        name = _CROSSING_TYPES.get(type(f.dataType).__name__)
        if name is None:
            raise CompileError(
                step_id,
                f"column {f.name!r} ({f.dataType.simpleString()}) cannot be sent to another "
                "site; pin the steps around it with at='edge' or at='cloud' so they stay together",
            )
        out[f.name] = name + ("?" if f.nullable else "")
    return out


_CROSSING_TYPES = {
    "StringType": "string",
    "LongType": "long",
    "IntegerType": "long",
    "ShortType": "long",
    "ByteType": "long",
    "DoubleType": "double",
    "FloatType": "double",
    "DecimalType": "double",
    "BooleanType": "boolean",
    "TimestampType": "timestamp",
    "TimestampNTZType": "timestamp",
    "BinaryType": "binary",
}


def _union(step: UnionStep, inputs: list[Frame]) -> Frame:
    first = inputs[0]
    df = first.df
    for other in inputs[1:]:
        if sorted(other.df.columns) != sorted(df.columns):
            raise CompileError(
                step.id,
                f"inputs have different columns: {sorted(df.columns)} and "
                f"{sorted(other.df.columns)}",
            )
        df = df.unionByName(other.df)
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


def _short(exc: Exception) -> str:
    text = str(exc).split("\n")[0]
    return text[:500]


def source_options(
    spec: PipelineSpec, step: SourceStep, nats_url: str, schema: Mapping[str, str] | None = None
) -> dict[str, str]:
    fields = dict(step.schema_ if schema is None else schema)
    return {
        "url": nats_url,
        "stream": step.stream,
        "pipeline": spec.instance,
        "step": step.id,
        "format": step.format.value,
        "schema": json.dumps(fields),
        "ddl": spark_ddl(fields, step.format),
        "filter_subjects": json.dumps(list(step.filter_subjects)),
        "max_rows": str(step.max_rows_per_batch),
        "partitions": str(step.partitions),
        "start": step.start,
        "csv_delimiter": step.csv_delimiter,
    }


def _with_watermark(frame: Frame, spec: PipelineSpec, field: str, delay: float) -> Frame:
    """Watermark where event time is declared, as Flink does at the source.

    Records filtered out later still advance event time. The delay also covers the
    longest ``deduplicate(within=...)`` of the pipeline, whose state Spark keeps for
    the watermark delay.
    """
    within = [s.within for s in spec.steps if isinstance(s, DeduplicateStep)]
    delay = max([delay, *within])
    df = frame.df.withWatermark(field, spark_interval(delay))
    return replace(frame, df=df, event_time=field, watermarked=True)


def _watermarked(frame: Frame, step_id: str) -> Frame:
    if frame.event_time is None or not frame.watermarked:
        raise CompileError(
            step_id, "needs event time: set event_time on the source or add with_event_time()"
        )
    return frame


def _user_schema(schema: Mapping[str, str]) -> StructType:
    ddl = ", ".join(f"`{n}` {SPARK_TYPES_BY_NAME[field_type(t)[0]]}" for n, t in schema.items())
    struct = StructType.fromDDL(ddl)
    assert isinstance(struct, StructType)
    return struct


def _python_step(
    ctx: CompileContext,
    spec: PipelineSpec,
    step_id: str,
    kind: str,
    ref: str,
    frame: Frame,
    schema: Mapping[str, str] | None,
) -> Frame:
    fn = resolve(ref, step_id, ctx.functions)
    out_struct = _user_schema(schema) if schema else frame.df.schema
    udf = arrow_udf(
        kind,
        fn,
        to_arrow_schema(out_struct, timezone="UTC"),
        url=ctx.nats_url,
        pipeline=spec.instance,
        step=step_id,
    )
    return replace(frame, df=frame.df.mapInArrow(udf, out_struct))


def _aggregate_column(name: str, text: str) -> Column:
    fn, field = parse_aggregate(text)
    if fn == "count":
        return F.count(F.lit(1) if field is None else F.col(field)).alias(name)
    assert field is not None  # parse_aggregate guarantees a field for these
    return {"sum": F.sum, "avg": F.avg, "min": F.min, "max": F.max}[fn](F.col(field)).alias(name)


def _partial_columns(name: str, text: str) -> list[Column]:
    """What one site contributes to an aggregate (see :func:`spanflow.spec.partial_columns`)."""
    fn, field = parse_aggregate(text)
    if fn != "avg":
        return [_aggregate_column(name, text)]
    assert field is not None
    return [
        F.sum(F.col(field)).alias(f"{name}__sum"),
        F.count(F.col(field)).alias(f"{name}__count"),
    ]


def _merge(step: MergeStep, up: Frame) -> Frame:
    """Fold the sites' partial aggregates of each (key, window) into the final values.

    The input is watermarked on ``window_end``, so a window is final once every site's
    partials have moved past it (Spark keeps the minimum watermark of the unioned
    sources)."""
    frame = _watermarked(up, step.id)
    folds = {"sum": F.sum, "min": F.min, "max": F.max}
    columns = []
    for name, text in step.aggregates.items():
        for column, fold in partial_columns(name, text).items():
            if column not in frame.df.columns:
                raise CompileError(step.id, f"partial column {column!r} is missing from the input")
            columns.append(folds[fold](F.col(column)).alias(column))
    grouped = frame.df.groupBy(*step.key, "window_start", "window_end").agg(*columns)
    finals = []
    for name, text in step.aggregates.items():
        fn, _ = parse_aggregate(text)
        if fn == "avg":
            finals.append(F.try_divide(F.col(f"{name}__sum"), F.col(f"{name}__count")).alias(name))
        else:
            finals.append(F.col(name))
    df = grouped.select(*step.key, "window_start", "window_end", *finals)
    return Frame(df, key=step.key, mode="append")


def _compile_step(ctx: CompileContext, spec: PipelineSpec, step: Step, up: Frame | None) -> Frame:
    if isinstance(step, SourceStep):
        schema = step_schema(ctx, step.schema_of) if step.schema_of else None
        df = (
            ctx.spark.readStream.format(ctx.source_format)
            .options(**source_options(spec, step, ctx.nats_url, schema))
            .option("phase_ms", str(ctx.slot[0]))
            .option("interval_ms", str(ctx.slot[1]))
            .load()
        )
        frame = Frame(df, key=(step.key,) if step.key else ())
        if step.event_time:
            frame = _with_watermark(frame, spec, step.event_time, step.max_out_of_orderness)
        return frame
    assert up is not None
    if isinstance(step, FilterStep):
        if step.function:
            return _python_step(ctx, spec, step.id, "filter", step.function, up, None)
        return replace(up, df=up.df.filter(F.expr(step.where or "true")))
    if isinstance(step, SelectStep):
        return replace(up, df=up.df.selectExpr(*step.columns))
    if isinstance(step, MapStep):
        if step.function:
            return _python_step(ctx, spec, step.id, "map", step.function, up, step.schema_)
        df = up.df
        for name, expression in (step.columns or {}).items():
            df = df.withColumn(name, F.expr(expression))
        return replace(up, df=df)
    if isinstance(step, FlatMapStep):
        return _python_step(ctx, spec, step.id, "flat_map", step.function, up, step.schema_)
    if isinstance(step, ForwardStep):
        return up
    if isinstance(step, SumStep):
        return replace(
            up,
            df=up.df.withColumn(step.output or step.field, F.col(step.field) + F.lit(step.value)),
        )
    if isinstance(step, KeyByStep):
        missing = [k for k in step.key if k not in up.df.columns]
        if missing:
            raise CompileError(step.id, f"unknown key field(s) {missing}; columns: {up.df.columns}")
        return replace(up, key=step.key)
    if isinstance(step, EventTimeStep):
        if step.field not in up.df.columns:
            raise CompileError(step.id, f"unknown field {step.field!r}; columns: {up.df.columns}")
        if up.watermarked:
            raise CompileError(
                step.id, f"event time is already set ({up.event_time!r}); set it once per stream"
            )
        frame = replace(up, df=up.df.withColumn(step.field, F.col(step.field).cast("timestamp")))
        return _with_watermark(frame, spec, step.field, step.max_out_of_orderness)
    if isinstance(step, DeduplicateStep):
        frame = _watermarked(up, step.id)
        return replace(frame, df=frame.df.dropDuplicatesWithinWatermark(list(step.key)))
    if isinstance(step, WindowStep):
        return _window(ctx, step, up)
    if isinstance(step, MergeStep):
        return _merge(step, up)
    if isinstance(step, CountStep):
        key = (step.key,) if step.key else up.key
        if not key:
            raise CompileError(step.id, "count needs a key: give key= or key_by() first")
        df = up.df.groupBy(*key).agg(F.count(F.lit(1)).alias("count"))
        return Frame(df, key=key, mode="update")
    if isinstance(step, AverageStep):
        frame = _watermarked(up, step.id)
        key = (step.key,) if step.key else frame.key
        assert frame.event_time is not None
        window = F.window(F.col(frame.event_time), spark_interval(step.window))
        df = frame.df.groupBy(*key, window).agg(F.avg(F.col(step.field)).alias("average"))
        df = df.select(
            *key,
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "average",
        )
        return Frame(df, key=key, mode="append")
    raise CompileError(step.id, f"step type {step.type!r} is not supported by the Spark runner")


WINDOW_TIME = "_window_time"
"""The event time of a window's result (its end, less a microsecond)."""


def _windowed(df: DataFrame, key: tuple[str, ...], mode: OutputMode) -> Frame:
    if mode == "append":  # final results carry event time on to the next window
        return Frame(df, key=key, event_time=WINDOW_TIME, watermarked=True, mode=mode)
    return Frame(df.drop(WINDOW_TIME), key=key, mode=mode)


def _window(ctx: CompileContext, step: WindowStep, up: Frame) -> Frame:
    frame = _watermarked(up, step.id)
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
            columns = [_aggregate_column(n, t) for n, t in step.aggregates.items()]
        df = grouped.agg(*columns)
        names = [c for c in df.columns if c not in frame.key and c != "window"]
        df = df.select(*frame.key, *bounds, *names)
        return _windowed(df, frame.key, mode)
    assert step.reduce is not None
    fn = resolve(step.reduce, step.id, ctx.functions)
    values = [c for c in frame.df.columns if not c.startswith("_") and c not in frame.key]
    collected = grouped.agg(F.collect_list(F.struct(*values)).alias("_rows"))
    collected = collected.select(*frame.key, *bounds[:2], "_rows")
    value_fields = [f for f in frame.df.schema.fields if f.name in values]
    out_struct = StructType(
        [f for f in collected.schema.fields if f.name != "_rows"] + value_fields
    )
    udf = reduce_udf(
        fn, to_arrow_schema(out_struct, timezone="UTC"), [*frame.key, "window_start", "window_end"]
    )
    return Frame(collected.mapInArrow(udf, out_struct), key=frame.key, mode=mode)
