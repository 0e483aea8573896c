"""Complex event patterns as a pipeline step: one row per match, per key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from spanflow.spec.patterns import RULE_NAME, PatternSpec, RuleSpec
from spanflow.spec.steps.base import Placement, StepBase, StreamFacts

MATCH_FIELDS = ("rule", "match_start", "match_end", "timed_out")
RULE_SET_FIELDS = ("rule", "version", "match_start", "match_end", "timed_out", "values")


class PatternStep(StepBase):
    """Finds event patterns in each key's events (FlinkCEP semantics, event-time order)
    and emits one row per match: the key, ``rule``, ``match_start``/``match_end``
    (event times of its first and last events) and the rule's selections.

    Three forms, one of them:

    * ``pattern`` (with ``select``, ``timeouts``, ``rule``): one pattern; ``select``
      maps output fields to Spark SQL over the match (``max(hot.temperature)``;
      default: each stage's event count); ``timeouts: true`` also emits partial
      matches that ran out of ``within`` (``timed_out`` true);
    * ``rules``: several such patterns at once (their selections share the output);
    * ``rule_set``: the name of a versioned rule set in the registry
      (``spanflow rules push``): a new version applies at the next micro-batch
      without a restart, and rows carry ``version`` and the selections as JSON in
      ``values``.

    Late events (not after the watermark) are dead-lettered with the reason."""

    placement: ClassVar[Placement] = Placement.KEYED

    def keeps_python_state(self) -> bool:
        return True

    local_reason: ClassVar[str] = "a pattern per key, where the key's events are born"
    upgrade_free: ClassVar[frozenset[str]] = frozenset(
        {"pattern", "select", "timeouts", "rule", "rules", "rule_set"}
    )
    """A key's state holds each rule's partial matches under the rule's name and
    fingerprint, and the events not yet matched: a new version's unchanged rules keep
    their partial matches, changed ones start theirs again, new ones start empty, and
    the waiting events go to the new rules (:mod:`spanflow.cep.processor`)."""

    type: Literal["pattern"] = "pattern"
    pattern: PatternSpec | None = None
    select: dict[str, str] = Field(default_factory=dict, description="Output field → SQL.")
    timeouts: bool = False
    rule: str | None = Field(
        default=None,
        pattern=RULE_NAME,
        description="The name in each row's 'rule' (default: the step id).",
    )
    rules: tuple[RuleSpec, ...] = Field(default=(), description="Several named patterns.")
    rule_set: str | None = Field(
        default=None, pattern=RULE_NAME, description="A versioned rule set in the registry."
    )

    @model_validator(mode="before")
    @classmethod
    def _one_form(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        forms = [f for f in ("pattern", "rules", "rule_set") if data.get(f)]
        if len(forms) != 1:
            raise ValueError(
                "a pattern step takes exactly one of pattern, rules or rule_set"
                + (f" (got {', '.join(forms)})" if forms else "")
            )
        if forms != ["pattern"] and any(data.get(f) for f in ("select", "timeouts", "rule")):
            raise ValueError(
                "select, timeouts and rule belong to the pattern form; give each rule its own"
            )
        return data

    @model_validator(mode="after")
    def _valid(self) -> PatternStep:
        names = [r.name for r in self.static_rules()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"rules {twice} are named twice")
        self._check_shared_selections()
        return self

    def _check_shared_selections(self) -> None:
        """Rules of one step share output columns: a field they both select must mean
        the same kind of value (checked by name here, by type when compiled)."""
        for rule in self.static_rules():
            taken = [n for n in rule.selections if n in RULE_SET_FIELDS]
            if taken:
                raise ValueError(f"rule {rule.name!r}: {taken} are fields every match row has")

    def static_rules(self) -> tuple[RuleSpec, ...]:
        """The rules fixed in the spec (none for a rule set)."""
        if self.pattern is not None:
            rule = RuleSpec(
                name=self.rule or self.id,
                pattern=self.pattern,
                select=self.select,
                timeouts=self.timeouts,
            )
            return (rule,)
        return self.rules

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
