"""Compile a pipeline spec into Structured Streaming DataFrames, one per sink.

Spark idioms stay in this package: SQL expression strings go straight to the JVM
(``expr``, ``selectExpr``) with no Python UDF; Python functions become ``mapInArrow``
functions; windows become ``window``/``session_window`` over a watermark; keyed
state lives in RocksDB (see :mod:`spanflow.spark.session`). Each step type's
compilation is found in the registry (:mod:`spanflow.spark.compile.registry`); this
module only walks the graph. Errors from Spark's analyser are re-raised naming the
step.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from spanflow.errors import CompileError
from spanflow.spark.compile.frame import CompileContext, Frame, OutputMode, spanflow_schema
from spanflow.spark.compile.registry import compiler_for
from spanflow.spark.compile.udf import UserFunction
from spanflow.spark.connectors.jetstream.source import FORMAT_NAME
from spanflow.spec.lateness import late_rules
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps import Step
from spanflow.spec.steps.io import SinkStep


@dataclass(frozen=True)
class CompiledSink:
    sink: SinkStep
    df: DataFrame
    mode: OutputMode


def compile_pipeline(
    spark: SparkSession,
    spec: PipelineSpec,
    *,
    nats_url: str,
    functions: Mapping[str, UserFunction] | None = None,
    source_format: str = FORMAT_NAME,
    plan: PipelineSpec | None = None,
    slot: tuple[int, int] = (0, 0),
    realtime: bool = False,
    sinks: Collection[str] | None = None,
    batch_plan: str | None = None,
    checkpoint: str | None = None,
    named_sources: bool = False,
) -> list[CompiledSink]:
    """One streaming DataFrame per sink (each becomes its own query).

    ``source_format`` is the registered name sources read through (see
    :func:`spanflow.spark.connectors.jetstream.source.register_isolated`). ``sinks``:
    only these sinks, and only the steps on their paths (a query compiles what it runs,
    no more). ``batch_plan``: where the sources agree their batches with the query's
    replicas (:mod:`spanflow.nats.batch_plan`). ``checkpoint``: the query's, where its
    sources read the watermark that makes a record late (one sink's query only).
    ``named_sources``: each source is named after its step, so the query's checkpoint
    keeps offsets by name (:mod:`spanflow.spark.checkpoints.source_names`).
    """
    core = spec.expanded()
    steps = list(core.topological())
    wanted: set[str] | None = None
    if sinks is not None:
        wanted = {s.id for sink in sinks for s in core.path_to(sink)}
        steps = [s for s in steps if s.id in wanted]
    ctx = CompileContext(
        spark,
        nats_url,
        functions or {},
        source_format,
        plan,
        slot,
        realtime,
        batch_plan,
        checkpoint,
        late_rules(core, wanted) if checkpoint and not realtime else {},
        named_sources,
    )
    frames = compile_frames(ctx, core, steps)
    out: list[CompiledSink] = []
    for step in core.sinks():
        if sinks is not None and step.id not in sinks:
            continue
        frame = frames[step.inputs[0]]
        if step.connector_info.append_only and frame.mode != "append":
            raise CompileError(
                step.id,
                f"a {step.connector} sink needs append output; use emit='final' windows",
            )
        out.append(CompiledSink(step, frame.df, frame.mode))
    return out


def compile_frames(ctx: CompileContext, spec: PipelineSpec, steps: list[Step]) -> dict[str, Frame]:
    frames: dict[str, Frame] = {}
    for step in steps:
        if isinstance(step, SinkStep):
            continue
        try:
            compile_step = compiler_for(step)
            frames[step.id] = compile_step(ctx, spec, step, [frames[i] for i in step.inputs])
            frames[step.id].df.schema  # noqa: B018 - force analysis so errors name this step
        except CompileError:
            raise
        except PySparkException as exc:
            raise CompileError(step.id, _short(exc)) from None
    return frames


def step_schema(ctx: CompileContext, step_id: str) -> dict[str, str]:
    """The record schema (spanflow types) of one step of the planned pipeline: what a
    fragment downstream of a cut reads. Analysis only; nothing is started."""
    if ctx.plan is None:
        raise CompileError(step_id, "a source with schema_of needs the planned pipeline")
    plan = ctx.plan.expanded()
    try:
        plan.step(step_id)
    except KeyError:
        raise CompileError(step_id, "schema_of names a step the pipeline does not have") from None
    frames = compile_frames(replace(ctx, plan=None), plan, plan.path_to(step_id))
    return spanflow_schema(step_id, frames[step_id].df.schema)


def _short(exc: Exception) -> str:
    text = str(exc).split("\n")[0]
    return text[:500]
