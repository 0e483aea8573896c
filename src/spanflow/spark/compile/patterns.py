"""The pattern step: :class:`spanflow.cep.processor.PatternMatcher` per key on
transformWithState, with event-time timers; with a rule set, the rules of each
micro-batch are the version pinned for it."""

from __future__ import annotations

import functools
from dataclasses import replace

from pyspark import TaskContext

from spanflow.cep.processor import PatternMatcher
from spanflow.cep.rule_store import version_for_batch
from spanflow.cep.rules import RuleSetError
from spanflow.errors import CompileError
from spanflow.spark.compile.frame import CompileContext, Frame, field_types, keyed, watermarked
from spanflow.spark.compile.process import transform_keyed, without_lateness_filter
from spanflow.spark.compile.registry import compiles
from spanflow.spec.expressions import result_type
from spanflow.spec.patterns import RuleSpec
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.patterns import PatternStep


def rule_set_matcher(
    *,
    url: str,
    rule_set: str,
    pipeline: str,
    step: str,
    event_time: str,
    timestamps: tuple[str, ...],
) -> PatternMatcher:
    """A matcher with the rule-set version pinned for the running micro-batch (Spark
    builds one per task and batch)."""
    ctx = TaskContext.get()
    batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    chosen = version_for_batch(url, rule_set, pipeline, step, batch)
    return PatternMatcher(
        event_time=event_time, rules=chosen.rules, version=chosen.version, timestamps=timestamps
    )


@compiles(PatternStep)
def compile_pattern(
    ctx: CompileContext, spec: PipelineSpec, step: PatternStep, inputs: list[Frame]
) -> Frame:
    frame = watermarked(keyed(inputs[0], step.id, "a pattern"), step.id)
    assert frame.event_time is not None
    fields = field_types(frame.df.schema)
    timestamps = tuple(n for n, t in fields.items() if t.rstrip("?") == "timestamp")
    output: dict[str, str] = {k: fields[k] for k in frame.key}
    output["rule"] = "string"
    output["match_start"] = output["match_end"] = "timestamp"
    output["timed_out"] = "boolean"
    if step.rule_set is not None:
        factory = functools.partial(
            rule_set_matcher,
            url=ctx.nats_url,
            rule_set=step.rule_set,
            pipeline=spec.instance,
            step=step.id,
            event_time=frame.event_time,
            timestamps=timestamps,
        )
        try:
            version_for_batch(ctx.nats_url, step.rule_set, spec.instance, step.id, None)
        except RuleSetError as exc:
            raise CompileError(step.id, str(exc)) from None
        output.update({"version": "long", "values": "string"})
    else:
        rules = step.static_rules()
        output.update(_selection_types(step.id, rules, fields, frame.key))
        factory = functools.partial(
            PatternMatcher,
            event_time=frame.event_time,
            rules=[r.model_dump(mode="json") for r in rules],
            timestamps=timestamps,
        )
    df = transform_keyed(
        ctx,
        spec,
        step.id,
        replace(frame, df=without_lateness_filter(frame.df, frame.event_time)),
        factory=factory,
        output=output,
        clock="event_time",
    )
    return Frame(df, key=frame.key, mode="append")


def _selection_types(
    step_id: str, rules: tuple[RuleSpec, ...], fields: dict[str, str], key: tuple[str, ...]
) -> dict[str, str]:
    """The output columns of the rules' selections; a column two rules share must
    have one type."""
    out: dict[str, str] = {}
    for rule in rules:
        stages = set(rule.pattern.positive_names)
        for name, text in rule.selections.items():
            kind = result_type(text, fields, stages)
            if name in key:
                raise CompileError(step_id, f"rule {rule.name!r}: select {name!r} is the key")
            if out.get(name, f"{kind}?") != f"{kind}?":
                raise CompileError(
                    step_id,
                    f"rule {rule.name!r}: select {name!r} is {kind} here and "
                    f"{out[name].rstrip('?')} in another rule",
                )
            out[name] = f"{kind}?"
    return out
