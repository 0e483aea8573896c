"""Count windows: windows of N records per key, on keyed state (a built-in processor,
:class:`~spanflow.spark.keyed.builtins.CountWindows`)."""

from __future__ import annotations

import functools

from spanflow.errors import CompileError
from spanflow.spark.compile.frame import CompileContext, Frame, keyed, spanflow_schema
from spanflow.spark.compile.process import transform_keyed
from spanflow.spark.compile.registry import compiles
from spanflow.spark.compile.udf import resolve
from spanflow.spark.keyed.builtins import CountWindows
from spanflow.spec.aggregates import parse_aggregate
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.windows import CountWindowStep


def aggregate_types(
    step_id: str, aggregates: dict[str, str], fields: dict[str, str]
) -> dict[str, str]:
    """Output type of each aggregate over input ``fields`` (all nullable)."""
    out: dict[str, str] = {}
    for name, text in aggregates.items():
        fn, field = parse_aggregate(text)
        source = fields.get(field or "", "long?").rstrip("?")
        if fn == "count":
            out[name] = "long"
        elif fn == "avg":
            out[name] = "double?"
        elif fn == "sum":
            out[name] = ("long" if source == "long" else "double") + "?"
        else:
            out[name] = source + "?"
    return out


@compiles(CountWindowStep)
def compile_count_window(
    ctx: CompileContext, spec: PipelineSpec, step: CountWindowStep, inputs: list[Frame]
) -> Frame:
    frame = keyed(inputs[0], step.id, "a count window")
    fields = spanflow_schema(step.id, frame.df.schema)
    for name, text in (step.aggregates or {}).items():
        _, field = parse_aggregate(text)
        if field is not None and field not in fields:
            raise CompileError(
                step.id, f"aggregate {name}={text!r}: no field {field!r}; fields: {sorted(fields)}"
            )
    output: dict[str, str] = {k: fields[k] for k in frame.key}
    output["window_index"] = "long"
    if frame.event_time:
        output["window_start"] = "timestamp?"
        output["window_end"] = "timestamp?"
    if step.aggregates:
        output.update(aggregate_types(step.id, step.aggregates, fields))
        reduce = None
    else:
        assert step.reduce is not None
        reduce = resolve(step.reduce, step.id, ctx.functions)
        output.update({k: v for k, v in fields.items() if k not in frame.key})
    factory = functools.partial(
        CountWindows,
        size=step.size,
        slide=step.slide,
        key_fields=frame.key,
        aggregates=step.aggregates,
        reduce=reduce,
        event_time=frame.event_time,
    )
    df = transform_keyed(ctx, spec, step.id, frame, factory=factory, output=output, clock="none")
    return Frame(df, key=frame.key, mode="append")
