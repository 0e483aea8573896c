"""What a step compiles from and to: a DataFrame plus what the spec knows about it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spanflow.errors import CompileError
from spanflow.spark.compile.udf import UserFunction, arrow_udf, resolve
from spanflow.spark.connectors.jetstream.source import FORMAT_NAME
from spanflow.spec.durations import spark_interval
from spanflow.spec.lateness import LateRule
from spanflow.spec.pipeline import PipelineSpec
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
    (:mod:`spanflow.spark.query.stagger`)."""
    realtime: bool = False
    """Compiling for Spark's Real-Time Mode (JetStream's, in
    :mod:`spanflow.spark.connectors.jetstream.realtime`): rows keep what the JVM sink
    derives message ids from (see :data:`REALTIME_ID_COLUMNS`)."""
    batch_plan: str | None = None
    """The key prefix under which sources agree their batches with the query's replicas
    (:mod:`spanflow.nats.batch_plan`); None: each plans alone."""
    checkpoint: str | None = None
    """The query's checkpoint location: sources read the watermark of the batch before
    there, to dead-letter late records (:mod:`spanflow.spec.lateness`)."""
    late_rules: Mapping[str, tuple[LateRule, ...]] = field(default_factory=dict)
    """Source id → the windows its records reach (:func:`spanflow.spec.lateness.late_rules`)."""
    named_sources: bool = False
    """Whether sources are named after their steps (offsets kept by name in the
    checkpoint: :mod:`spanflow.spark.checkpoints.source_names`)."""
    passive: bool = False
    """Sources only look (:attr:`spanflow.spark.connectors.SourceContext.passive`)."""


REALTIME_ID_COLUMNS = ("_seq", "_updates")
"""Hidden columns a real-time sink derives each message id from: a per-event row's
source sequence, an aggregate update's number (a count of its group's rows). Both make
every distinct output row distinct and are the same when Spark replays a batch."""


def updates_column() -> Column:
    """``_updates``: the update number of a group in update mode (its row count)."""
    return F.count(F.lit(1)).alias("_updates")


def with_watermark(frame: Frame, spec: PipelineSpec, field: str, delay: float) -> Frame:
    """Watermark where event time is declared, as Flink does at the source.

    Records filtered out later still advance event time. The delay grows by the
    longest ``allowed_lateness`` of the pipeline's windows, and covers the longest
    state horizon of its steps (``deduplicate(within=...)``, whose state Spark keeps
    for the watermark delay).
    """
    lateness = max((s.state_lateness() for s in spec.steps), default=0.0)
    delay = max([delay + lateness, *(s.state_horizon() for s in spec.steps)])
    df = frame.df.withWatermark(field, spark_interval(delay))
    return replace(frame, df=df, event_time=field, watermarked=True)


def watermarked(frame: Frame, step_id: str) -> Frame:
    """``frame`` if it has event time; else a CompileError naming the step."""
    if frame.event_time is None or not frame.watermarked:
        raise CompileError(
            step_id, "needs event time: set event_time on the source or add with_event_time()"
        )
    return frame


ALL = "_all"
"""The constant key column of a keyed step over a stream without a key."""


def keyed_or_whole(frame: Frame) -> Frame:
    """``frame`` if it has a key; else keyed by a constant, so that a keyed step runs
    over the whole stream as one key (one model, one running aggregate)."""
    if frame.key:
        return frame
    return replace(frame, df=frame.df.withColumn(ALL, F.lit(0)), key=(ALL,))


def keyed_input(step_id: str, inputs: list[Frame]) -> tuple[Frame, Frame, dict[str, str]]:
    """A keyed step's one input: as it comes, keyed (:func:`keyed_or_whole`), and its
    fields."""
    (up,) = inputs
    return up, keyed_or_whole(up), spanflow_schema(step_id, up.df.schema)


def keyed(frame: Frame, step_id: str, what: str) -> Frame:
    """``frame`` if it has a key; else a CompileError naming the step."""
    if not frame.key:
        raise CompileError(step_id, f"{what} needs a key: add key_by(...) before it")
    return frame


def user_schema(schema: Mapping[str, str]) -> StructType:
    """A spanflow schema (``{"t": "double?"}``) as a Spark struct."""
    ddl = ", ".join(f"`{n}` {SPARK_TYPES_BY_NAME[field_type(t)[0]]}" for n, t in schema.items())
    struct = StructType.fromDDL(ddl)
    assert isinstance(struct, StructType)
    return struct


def python_step(
    ctx: CompileContext,
    spec: PipelineSpec,
    step_id: str,
    kind: str,
    ref: str,
    frame: Frame,
    schema: Mapping[str, str] | None,
) -> Frame:
    """A per-record Python function (map, filter, flat_map) as a ``mapInArrow``."""
    fn = resolve(ref, step_id, ctx.functions)
    out_struct = user_schema(schema) if schema else frame.df.schema
    udf = arrow_udf(
        kind,
        fn,
        to_arrow_schema(out_struct, timezone="UTC"),
        url=ctx.nats_url,
        pipeline=spec.instance,
        step=step_id,
    )
    return replace(frame, df=frame.df.mapInArrow(udf, out_struct))


def require_columns(frame: Frame, step_id: str, fields: tuple[str, ...], role: str) -> None:
    """A CompileError naming the step when ``fields`` are not all columns of the frame."""
    missing = [f for f in fields if f not in frame.df.columns]
    if missing:
        raise CompileError(
            step_id, f"unknown {role} field(s) {missing}; columns: {frame.df.columns}"
        )


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


def field_types(struct: StructType) -> dict[str, str]:
    """The spanflow type of each user column of ``struct`` that has one (metadata
    columns and nested types left out)."""
    out: dict[str, str] = {}
    for f in struct.fields:
        name = _CROSSING_TYPES.get(type(f.dataType).__name__)
        if name is not None and not f.name.startswith("_"):
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
