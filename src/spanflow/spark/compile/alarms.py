"""``suppress``: one record per key per period or incident, on keyed state (a built-in
processor, :class:`~spanflow.spark.keyed.builtins.Suppression`)."""

from __future__ import annotations

import functools

from spanflow.spark.compile.frame import CompileContext, Frame, keyed_input
from spanflow.spark.compile.process import transform_keyed
from spanflow.spark.compile.registry import compiles
from spanflow.spark.keyed.builtins import Suppression
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.alarms import SUPPRESSED, SuppressStep


@compiles(SuppressStep)
def compile_suppress(
    ctx: CompileContext, spec: PipelineSpec, step: SuppressStep, inputs: list[Frame]
) -> Frame:
    up, frame, fields = keyed_input(step.id, inputs)
    output = {k: v for k, v in fields.items() if k != SUPPRESSED}
    output[SUPPRESSED] = "long"
    factory = functools.partial(
        Suppression,
        once_per=step.once_per,
        until=step.until,
        event_time=up.event_time,
        hidden=tuple(c for c in frame.df.columns if c not in output),
    )
    df = transform_keyed(ctx, spec, step.id, frame, factory=factory, output=output, clock="none")
    return Frame(df, key=up.key, mode="append")
