"""The pattern step: :class:`spanflow.cep.processor.PatternMatcher` per key on
transformWithState, with event-time timers."""

from __future__ import annotations

import functools
from dataclasses import replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spanflow.cep.processor import PatternMatcher, default_select
from spanflow.errors import CompileError
from spanflow.spark.compile.frame import CompileContext, Frame, field_types, keyed, watermarked
from spanflow.spark.compile.process import transform_keyed
from spanflow.spark.compile.registry import compiles
from spanflow.spec.expressions import ExpressionError, result_type
from spanflow.spec.patterns import PatternError
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.patterns import PatternStep


@compiles(PatternStep)
def compile_pattern(
    ctx: CompileContext, spec: PipelineSpec, step: PatternStep, inputs: list[Frame]
) -> Frame:
    frame = watermarked(keyed(inputs[0], step.id, "a pattern"), step.id)
    assert frame.event_time is not None
    fields = field_types(frame.df.schema)
    select = dict(step.select) or default_select(step.pattern)
    factory = functools.partial(
        PatternMatcher,
        pattern=step.pattern.model_dump(mode="json"),
        event_time=frame.event_time,
        rule=step.rule_name,
        select=select,
        timeouts=step.timeouts,
        timestamps=tuple(n for n, t in fields.items() if t.rstrip("?") == "timestamp"),
    )
    try:
        factory()  # bad conditions and selections are reported when the pipeline starts
        stages = set(step.pattern.positive_names)
        types = {name: result_type(text, fields, stages) for name, text in select.items()}
    except (PatternError, ExpressionError) as exc:
        raise CompileError(step.id, str(exc)) from None
    output: dict[str, str] = {k: fields[k] for k in frame.key}
    output.update({"rule": "string", "match_start": "timestamp", "match_end": "timestamp"})
    if step.timeouts:
        output["timed_out"] = "boolean"
    output.update({name: f"{kind}?" for name, kind in types.items()})
    df = transform_keyed(
        ctx,
        spec,
        step.id,
        replace(frame, df=_without_lateness_filter(frame.df, frame.event_time)),
        factory=factory,
        output=output,
        clock="event_time",
    )
    return Frame(df, key=frame.key, mode="append")


def _without_lateness_filter(df: DataFrame, event_time: str) -> DataFrame:
    """``df`` with its event-time column recomputed, so that the column no longer
    carries the watermark: transformWithState would otherwise drop late rows before
    the processor sees them, and a late event must be dead-lettered with its reason
    (the processor compares it with the watermark itself). The query's watermark is
    unchanged, so event-time timers fire as before."""
    same = F.timestamp_micros(F.unix_micros(F.col(event_time)))
    return df.withColumn(event_time, same)
