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
    PipelineSpec,
    SelectStep,
    SinkStep,
    SourceStep,
    Step,
    SumStep,
    WindowStep,
    parse_aggregate,
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


def compile_pipeline(
    spark: SparkSession,
    spec: PipelineSpec,
    *,
    nats_url: str,
    functions: Mapping[str, UserFunction] | None = None,
    source_format: str = FORMAT_NAME,
) -> list[CompiledSink]:
    """One streaming DataFrame per sink (each becomes its own query).

    ``source_format`` is the registered name sources read through (see
    :func:`spanflow.spark.jetstream.register_isolated`).
    """
    ctx = CompileContext(spark, nats_url, functions or {}, source_format)
    frames: dict[str, Frame] = {}
    out: list[CompiledSink] = []
    for step in spec.topological():
        if isinstance(step, SinkStep):
            frame = frames[step.inputs[0]]
            if step.kind == "parquet" and frame.mode != "append":
                raise CompileError(
                    step.id, "a parquet sink needs append output; use emit='final' windows"
                )
            out.append(CompiledSink(step, frame.df, frame.mode))
            continue
        upstream = frames[step.inputs[0]] if step.inputs else None
        try:
            frames[step.id] = _compile_step(ctx, spec, step, upstream)
            frames[step.id].df.schema  # noqa: B018 - force analysis so errors name this step
        except CompileError:
            raise
        except PySparkException as exc:
            raise CompileError(step.id, _short(exc)) from None
    return out


def _short(exc: Exception) -> str:
    text = str(exc).split("\n")[0]
    return text[:500]


def source_options(spec: PipelineSpec, step: SourceStep, nats_url: str) -> dict[str, str]:
    return {
        "url": nats_url,
        "stream": step.stream,
        "pipeline": spec.name,
        "step": step.id,
        "format": step.format.value,
        "schema": json.dumps(step.schema_),
        "ddl": spark_ddl(step.schema_, step.format),
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
        pipeline=spec.name,
        step=step_id,
    )
    return replace(frame, df=frame.df.mapInArrow(udf, out_struct))


def _aggregate_column(name: str, text: str) -> Column:
    fn, field = parse_aggregate(text)
    if fn == "count":
        return F.count(F.lit(1) if field is None else F.col(field)).alias(name)
    assert field is not None  # parse_aggregate guarantees a field for these
    return {"sum": F.sum, "avg": F.avg, "min": F.min, "max": F.max}[fn](F.col(field)).alias(name)


def _compile_step(ctx: CompileContext, spec: PipelineSpec, step: Step, up: Frame | None) -> Frame:
    if isinstance(step, SourceStep):
        df = (
            ctx.spark.readStream.format(ctx.source_format)
            .options(**source_options(spec, step, ctx.nats_url))
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
    bounds = [F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end")]
    mode: OutputMode = "append" if step.emit == "final" else "update"
    if step.aggregates:
        df = grouped.agg(*[_aggregate_column(n, t) for n, t in step.aggregates.items()])
        names = list(step.aggregates)
        df = df.select(*frame.key, *bounds, *names)
        return Frame(df, key=frame.key, mode=mode)
    assert step.reduce is not None
    fn = resolve(step.reduce, step.id, ctx.functions)
    values = [c for c in frame.df.columns if not c.startswith("_") and c not in frame.key]
    collected = grouped.agg(F.collect_list(F.struct(*values)).alias("_rows"))
    collected = collected.select(*frame.key, *bounds, "_rows")
    value_fields = [f for f in frame.df.schema.fields if f.name in values]
    out_struct = StructType(
        [f for f in collected.schema.fields if f.name != "_rows"] + value_fields
    )
    udf = reduce_udf(
        fn, to_arrow_schema(out_struct, timezone="UTC"), [*frame.key, "window_start", "window_end"]
    )
    return Frame(collected.mapInArrow(udf, out_struct), key=frame.key, mode=mode)
