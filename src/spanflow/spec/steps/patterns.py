"""Complex event patterns as a pipeline step: one row per match, per key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from spanflow.spec.expressions import ExpressionError, compile_expression
from spanflow.spec.patterns import PatternSpec
from spanflow.spec.steps.base import Placement, StepBase, StreamFacts

MATCH_FIELDS = ("rule", "match_start", "match_end", "timed_out")


class PatternStep(StepBase):
    """Finds ``pattern`` in each key's events (FlinkCEP semantics, event-time order)
    and emits one row per match: the key, ``rule`` (the step's ``rule`` name),
    ``match_start``/``match_end`` (event times of its first and last events) and
    ``select`` — output field → Spark SQL over the match (``max(hot.temperature)``,
    ``count(hot)``, ``last(drop.pressure)``; default: each stage's event count).
    ``timeouts: true`` also emits partial matches that ran out of ``within``, with
    ``timed_out`` true. Late events (not after the watermark) are dead-lettered."""

    placement: ClassVar[Placement] = Placement.KEYED
    local_reason: ClassVar[str] = "a pattern per key, where the key's events are born"

    type: Literal["pattern"] = "pattern"
    pattern: PatternSpec
    select: dict[str, str] = Field(default_factory=dict, description="Output field → SQL.")
    timeouts: bool = False
    rule: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The name in each row's 'rule' (default: the step id).",
    )

    @model_validator(mode="after")
    def _valid(self) -> PatternStep:
        taken = [n for n in self.select if n in MATCH_FIELDS]
        if taken:
            raise ValueError(f"select: {taken} are fields every match row has; pick other names")
        stages = set(self.pattern.positive_names)
        for name, text in self.select.items():
            try:
                compile_expression(text, stages=stages, selection=True)
            except ExpressionError as exc:
                raise ValueError(f"select {name!r}: {exc}") from None
        return self

    @property
    def rule_name(self) -> str:
        return self.rule or self.id

    def check_inputs(self, inputs: Sequence[StreamFacts]) -> None:
        if not inputs[0].key:
            raise ValueError(
                f"pattern {self.id!r} matches per key: add key_by(...) before it "
                "(or give the source a key)"
            )
        if inputs[0].event_time is None:
            raise ValueError(
                f"pattern {self.id!r} orders each key's events by event time: set event_time "
                "on the source or add with_event_time(...) before it"
            )

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        up = inputs[0]
        return StreamFacts(key=up.key, entity=frozenset(up.entity & set(up.key)), event_time=None)
