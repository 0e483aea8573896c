"""Keyed process functions: a user's :class:`~spanflow.KeyedProcessor` on Spark's
``transformWithState`` (state in RocksDB, checkpointed with the query)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from spanflow.api.processor import KeyedProcessor
from spanflow.errors import CompileError
from spanflow.spark.compile.frame import (
    CompileContext,
    Frame,
    OutputMode,
    keyed,
    user_schema,
    watermarked,
)
from spanflow.spark.compile.registry import compiles
from spanflow.spark.compile.udf import resolve
from spanflow.spark.keyed.processor import OutputField, ProcessorAdapter, ProcessorSettings
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.schema import field_type
from spanflow.spec.steps.keyed import ProcessStep

TIME_MODES = {"event_time": "EventTime", "processing_time": "ProcessingTime", "none": "None"}

BUCKET_IDS: tuple[int, ...] = (12, 64, 10, 1, 37, 20, 32, 35)
"""The groups a keyed step's keys are spread over, by a hash of the key. Spark hashes
the group id again to pick a shuffle partition; these ids are the smallest integers
whose Spark hash falls on each residue modulo 8, so 1, 2, 4 or 8 shuffle partitions
each get the same number of buckets. Eight: every bucket costs Spark a pandas frame
in and out and round trips to the JVM per batch, and at 2,000 events/s 32 buckets
added ≈75 ms a batch to 8 (docs/benchmarks.md); more than 8 shuffle partitions would
leave some without keyed work. Fixed for the life of a checkpoint: a key's state is
found in its bucket."""


def processor_class(ref: str, step_id: str, local: Mapping[str, Any]) -> type[KeyedProcessor]:
    """The KeyedProcessor subclass behind ``module:Class`` (a CompileError otherwise)."""
    cls = resolve(ref, step_id, local)
    if not (isinstance(cls, type) and issubclass(cls, KeyedProcessor)):
        raise CompileError(step_id, f"{ref!r} is not a class derived from spanflow.KeyedProcessor")
    return cls


def default_clock(step: ProcessStep, cls: type[KeyedProcessor], frame: Frame) -> str:
    """Event time when the stream has it; else processing time if the class has timers.

    Without event time and timers, ``none``: Spark then runs no batch without input
    (a processing-time processor runs one every trigger)."""
    if step.timers is not None:
        return step.timers
    if frame.watermarked:
        return "event_time"
    overrides_timer = cls.on_timer is not KeyedProcessor.on_timer
    return "processing_time" if overrides_timer else "none"


def output_fields(schema: Mapping[str, str]) -> tuple[OutputField, ...]:
    out = []
    for name, declared in schema.items():
        kind, optional = field_type(declared)
        out.append(OutputField(name, kind, optional))
    return tuple(out)


def transform_keyed(
    ctx: CompileContext,
    spec: PipelineSpec,
    step_id: str,
    frame: Frame,
    *,
    factory: Callable[[], KeyedProcessor],
    output: Mapping[str, str],
    clock: str,
    output_event_time: str | None = None,
    mode: OutputMode = "append",
    order_by: tuple[str, ...] | None = None,
    late_field: str | None = None,
) -> DataFrame:
    """``frame`` grouped by its key through a keyed processor (users' and built-ins').

    A key's records reach the processor sorted by ``order_by`` (default: event time,
    then stream sequence). Spark hands them over as pandas frames
    (``transformWithStateInPandas``): its row-based variant reads every cell of every
    row on its own and was half as fast (benchmarks/node_throughput.py)."""
    if order_by is None:
        order_by = tuple(
            f for f in (frame.event_time, "_seq") if f is not None and f in frame.df.columns
        )
    names = tuple(frame.df.columns)
    micros = tuple(
        i for i, f in enumerate(frame.df.schema.fields) if isinstance(f.dataType, TimestampType)
    )
    settings = ProcessorSettings(
        factory=factory,
        key_fields=frame.key,
        output=output_fields(output),
        clock=clock,
        order_by=order_by,
        pipeline=spec.instance,
        step=step_id,
        nats_url=ctx.nats_url,
        input_names=names,
        input_micros=micros,
        late_field=late_field,
    )
    # Spark regroups rows through namedtuples, which rename fields like '_seq' or
    # 'class'; positional names survive, and the adapter puts the real ones back.
    positional = [f"c{i}" for i in range(len(names))]
    renamed = frame.df.toDF(*positional)
    # Timestamps cross as microseconds: Spark's pandas path builds a pd.Timestamp for
    # every value it regroups (≈20 % of a keyed step's Python time); the adapter turns
    # the numbers back into datetimes in one numpy pass.
    for i in micros:
        renamed = renamed.withColumn(positional[i], F.unix_micros(F.col(positional[i])))
    key = [positional[names.index(k)] for k in frame.key]
    return (
        bucketed(renamed, key)
        .groupBy(BUCKET)
        .transformWithStateInPandas(
            ProcessorAdapter(settings),
            user_schema(output),
            "Append" if mode == "append" else "Update",
            TIME_MODES[clock],
            eventTimeColumnName=output_event_time or "",
        )
    )


BUCKET = "spanflow_bucket"


def bucketed(df: DataFrame, key: list[str]) -> DataFrame:
    """``df`` with the bucket of each row's key as its last column (see
    :data:`BUCKET_IDS`): Spark calls a keyed processor once per bucket and batch, and
    the processor splits the bucket's records by key (:mod:`spanflow.spark.keyed.processor`)."""
    ids = F.array(*(F.lit(i) for i in BUCKET_IDS))
    slot = F.pmod(F.xxhash64(*key), F.lit(len(BUCKET_IDS))).cast("int") + 1
    return df.withColumn(BUCKET, F.element_at(ids, slot).cast("int"))


def without_lateness_filter(df: DataFrame, event_time: str | None) -> DataFrame:
    """``df`` with its event-time column recomputed, so that the column no longer
    carries the watermark: transformWithState would otherwise drop late rows before
    the processor sees them, and a late row must be dead-lettered with its reason
    (the adapter or the processor compares it with the watermark itself). The query's
    watermark is unchanged, so event-time timers fire as before."""
    if event_time is None:
        return df
    same = F.timestamp_micros(F.unix_micros(F.col(event_time)))
    return df.withColumn(event_time, same)


@compiles(ProcessStep)
def compile_process(
    ctx: CompileContext, spec: PipelineSpec, step: ProcessStep, inputs: list[Frame]
) -> Frame:
    frame = keyed(inputs[0], step.id, "a keyed processor")
    cls = processor_class(step.processor, step.id, ctx.functions)
    factory = functools.partial(cls, **step.params)
    try:
        factory()  # constructor errors surface when the pipeline starts, not in a worker
    except Exception as exc:
        raise CompileError(step.id, f"{step.processor}(**params) failed: {exc}") from None
    clock = default_clock(step, cls, frame)
    late_field = None
    if clock == "event_time":
        watermarked(frame, step.id)
        late_field = frame.event_time
        frame = replace(frame, df=without_lateness_filter(frame.df, frame.event_time))
    df = transform_keyed(
        ctx,
        spec,
        step.id,
        frame,
        factory=factory,
        output=step.output_schema,
        clock=clock,
        output_event_time=step.output_event_time,
        late_field=late_field,
    )
    kept = tuple(k for k in frame.key if k in step.output_schema)
    return Frame(
        df,
        key=kept if len(kept) == len(frame.key) else (),
        event_time=step.output_event_time,
        watermarked=step.output_event_time is not None,
        mode="append",
    )
