"""Joins: stream-stream interval joins (Spark's own, on watermarks) and stream-table
enrichment (a live key-value bucket through keyed state, or a file)."""

from __future__ import annotations

import functools
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spanflow.errors import CompileError
from spanflow.nats.streams import SyncNats
from spanflow.spark.checkpoints.source_names import source_name
from spanflow.spark.compile.frame import (
    CompileContext,
    Frame,
    require_columns,
    spanflow_schema,
    user_schema,
    watermarked,
)
from spanflow.spark.compile.process import transform_keyed
from spanflow.spark.compile.registry import compiles
from spanflow.spark.connectors import SourceContext
from spanflow.spark.connectors.jetstream.source import source_options
from spanflow.spark.formats import spark_ddl
from spanflow.spark.keyed.builtins import TableLookup
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.schema import StreamFormat
from spanflow.spec.steps.io import SourceStep
from spanflow.spec.steps.joins import EnrichStep, JoinStep

_RIGHT_KEY = "__right_{}"


def _interval(seconds: float) -> str:
    return f"INTERVAL {round(abs(seconds) * 1000)} MILLISECONDS"


def _bound(left_time: str, right_time: str, seconds: float, op: str) -> Column:
    """``right op left ± |seconds|`` as SQL Spark can read time bounds from."""
    sign = "-" if seconds < 0 else "+"
    return F.expr(f"`{right_time}` {op} `{left_time}` {sign} {_interval(seconds)}")


@compiles(JoinStep)
def compile_join(
    ctx: CompileContext, spec: PipelineSpec, step: JoinStep, inputs: list[Frame]
) -> Frame:
    left, right = (watermarked(f, step.id) for f in inputs)
    require_columns(left, step.id, step.on, "join")
    require_columns(right, step.id, step.on, "join")
    assert left.event_time is not None and right.event_time is not None
    renamed: dict[str, str] = {}
    columns = []
    for name in right.df.columns:
        if name.startswith("_"):
            continue  # the left record's metadata stays
        if name in step.on:
            new = _RIGHT_KEY.format(name)
        elif name in left.df.columns:
            new = name + step.suffix
        else:
            new = name
        renamed[name] = new
        columns.append(F.col(f"`{name}`").alias(new))
    right_df = right.df.select(*columns)
    right_time = renamed.get(right.event_time)
    if right_time is None:
        raise CompileError(step.id, f"the right input's event time {right.event_time!r} is lost")
    condition = F.lit(True)
    for name in step.on:
        condition = condition & (F.col(f"`{name}`") == F.col(_RIGHT_KEY.format(name)))
    condition = (
        condition
        & _bound(left.event_time, right_time, step.lower, ">=")
        & _bound(left.event_time, right_time, step.upper, "<=")
    )
    joined = left.df.join(right_df, condition, "inner" if step.how == "inner" else "leftouter")
    keep = [c for c in joined.columns if c not in {_RIGHT_KEY.format(n) for n in step.on}]
    return Frame(
        joined.select(*[F.col(f"`{c}`") for c in keep]),
        key=left.key,
        event_time=left.event_time,
        watermarked=True,
        mode="append",
    )


@compiles(EnrichStep)
def compile_enrich(
    ctx: CompileContext, spec: PipelineSpec, step: EnrichStep, inputs: list[Frame]
) -> Frame:
    (frame,) = inputs
    require_columns(frame, step.id, (step.on,), "enrich 'on'")
    taken = set(frame.df.columns)
    names = {f: (f + step.suffix if f in taken else f) for f in step.schema_}
    if step.bucket is not None:
        return _enrich_live(ctx, spec, step, frame, step.bucket, names)
    assert step.path is not None
    return _enrich_from_file(ctx, step, frame, Path(step.path), names)


def _enrich_from_file(
    ctx: CompileContext, step: EnrichStep, frame: Frame, path: Path, names: dict[str, str]
) -> Frame:
    """A file read once, broadcast and joined to every micro-batch."""
    if not path.is_file():
        raise CompileError(step.id, f"table file {str(path)!r} does not exist")
    fields = {step.on: "string", **{f: t.rstrip("?") + "?" for f, t in step.schema_.items()}}
    schema = user_schema(fields)
    reader = ctx.spark.read.schema(schema)
    if path.suffix.lower() == ".csv":
        table = reader.option("header", "true").option("mode", "DROPMALFORMED").csv(str(path))
    elif path.suffix.lower() in (".json", ".jsonl", ".ndjson"):
        table = reader.option("mode", "DROPMALFORMED").json(str(path))
    else:
        raise CompileError(
            step.id, f"table file {path.name!r}: use .csv (with a header) or .json lines"
        )
    key = "__table_key"
    table = table.select(
        F.col(f"`{step.on}`").cast("string").alias(key),
        *[F.col(f"`{f}`").alias(names[f]) for f in step.schema_],
    ).dropDuplicates([key])
    how = "inner" if step.how == "inner" else "leftouter"
    condition = F.col(f"`{step.on}`").cast("string") == F.col(key)
    joined = frame.df.join(F.broadcast(table), condition, how).drop(key)
    return Frame(
        joined,
        key=frame.key,
        event_time=frame.event_time,
        watermarked=frame.watermarked,
        mode=frame.mode,
    )


def _enrich_live(
    ctx: CompileContext,
    spec: PipelineSpec,
    step: EnrichStep,
    frame: Frame,
    bucket: str,
    names: dict[str, str],
) -> Frame:
    """Records and the bucket's changes, read as two streams (both replayable by
    sequence, so a restarted batch sees the same table), meet in keyed state: per
    join value, the current row, and records in the order they were stored."""
    if frame.mode != "append":
        raise CompileError(step.id, "enrich needs append input (final windows, not updates)")
    _ensure_bucket(ctx.nats_url, bucket)
    table_fields = {f: t.rstrip("?") + "?" for f, t in step.schema_.items()}
    prefix = f"$KV.{bucket}."
    changelog = SourceStep(id=step.id, stream=f"KV_{bucket}", schema=table_fields)
    source = SourceContext(
        spark=ctx.spark,
        nats_url=ctx.nats_url,
        pipeline=spec.instance,
        query_token="",
        ddl=spark_ddl(table_fields, StreamFormat.JSON),
        schema=table_fields,
        data_source=ctx.source_format,
        slot=ctx.slot,
        batch_plan=ctx.batch_plan,
        source_name=source_name(f"{step.id}__changes") if ctx.named_sources else None,
    )
    options = {
        **source_options(source, changelog),
        "tombstones": "true",
        "heartbeat": "",
        "phase_ms": str(ctx.slot[0]),
        "interval_ms": str(ctx.slot[1]),
    }
    changes = source.reader().format(ctx.source_format).options(**options).load()
    event_struct = frame.df.schema
    entry_struct = StructType([f for f in changes.schema.fields if f.name in table_fields])
    events = frame.df.select(
        F.col(f"`{step.on}`").cast("string").alias("_join"),
        F.lit(False).alias("_table"),
        F.lit(1).alias("_rank"),
        F.struct(*[F.col(f"`{c}`") for c in frame.df.columns]).alias("_event"),
        F.lit(None).cast(entry_struct).alias("_entry"),
        _stored_at(frame.df).alias("_at"),
    )
    table = changes.select(
        F.expr(f"substring(_subject, {len(prefix) + 1})").alias("_join"),
        F.lit(True).alias("_table"),
        F.lit(0).alias("_rank"),  # a change stored with a record applies to it
        F.lit(None).cast(event_struct).alias("_event"),
        F.struct(*[F.col(f"`{c}`") for c in table_fields]).alias("_entry"),
        F.col("_published").alias("_at"),
    )
    both = Frame(events.unionByName(table), key=("_join",))
    fields = spanflow_schema(step.id, frame.df.schema)
    output = dict(fields)
    output.update({names[f]: t for f, t in table_fields.items()})
    factory = functools.partial(TableLookup, fields=names, inner=step.how == "inner")
    df: DataFrame = transform_keyed(
        ctx,
        spec,
        step.id,
        both,
        factory=factory,
        output=output,
        clock="none",
        order_by=("_at", "_rank"),
    )
    return Frame(df, key=frame.key, mode="append")


def _stored_at(df: DataFrame) -> Column:
    """When a record was stored (orders it against table changes); records computed
    from several (no ``_published``) count as stored now."""
    if "_published" in df.columns:
        return F.col("_published")
    return F.current_timestamp()


def _ensure_bucket(url: str, bucket: str) -> None:
    """Create the bucket if it is missing: a left join then gives nulls until entries
    are put, instead of a failing query."""
    from spanflow.nats.cluster import ensure_kv

    client = SyncNats(url)
    try:
        client.run(lambda: ensure_kv(client.js, bucket))
    except Exception as exc:
        raise CompileError(
            f"kv:{bucket}", f"cannot open key-value bucket {bucket!r}: {exc}"
        ) from None
    finally:
        client.close()
