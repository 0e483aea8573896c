"""Running aggregates emitted with every record (a built-in keyed processor)."""

from __future__ import annotations

import functools

from spanflow.errors import CompileError
from spanflow.spark.compile.count_windows import aggregate_types
from spanflow.spark.compile.frame import CompileContext, Frame, keyed_or_whole, spanflow_schema
from spanflow.spark.compile.process import transform_keyed
from spanflow.spark.compile.registry import compiles
from spanflow.spark.keyed.builtins import RunningAggregate
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.keyed import RunningStep


@compiles(RunningStep)
def compile_running(
    ctx: CompileContext, spec: PipelineSpec, step: RunningStep, inputs: list[Frame]
) -> Frame:
    (up,) = inputs
    frame = keyed_or_whole(up)
    fields = spanflow_schema(step.id, frame.df.schema)
    if step.fn != "count" and step.field not in fields:
        raise CompileError(
            step.id, f"no field {step.field!r} to {step.fn}; fields: {sorted(fields)}"
        )
    text = "count" if step.fn == "count" else f"{step.fn}({step.field})"
    output = dict(fields)
    output.update(aggregate_types(step.id, {step.target: text}, fields))
    factory = functools.partial(
        RunningAggregate, fn=step.fn, field=step.field, output=step.target, key_fields=frame.key
    )
    df = transform_keyed(ctx, spec, step.id, frame, factory=factory, output=output, clock="none")
    key = up.key if step.target not in up.key else ()
    return Frame(df, key=key, mode="append")
