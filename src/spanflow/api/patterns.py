"""The fluent pattern builder: FlinkCEP's ``Pattern`` API in Python, conditions as
Spark SQL strings.

>>> p = (Pattern.begin("hot").where("temperature > 80")
...      .followed_by("drop").where("pressure < 2").within("30s"))
>>> [s.name for s in p.spec().stages], p.spec().within
(['hot', 'drop'], 30.0)

Each method returns a new pattern (a pattern is a value). Quantifiers and options
apply to the last stage, as in FlinkCEP. Problems are reported when the pattern is
built into a spec (:meth:`Pattern.spec`) or used by a pipeline, naming the stage.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from spanflow.errors import SpecError
from spanflow.spec.durations import parse_duration
from spanflow.spec.patterns import Contiguity, PatternSpec, RuleSpec


class Pattern:
    """A sequence of named stages; see :mod:`spanflow.spec.patterns` for the rules."""

    def __init__(
        self,
        stages: tuple[dict[str, Any], ...],
        within: float | None = None,
        skip: str = "no_skip",
        skip_stage: str | None = None,
    ) -> None:
        self._stages = stages
        self._within = within
        self._skip = skip
        self._skip_stage = skip_stage

    # -- stages -------------------------------------------------------------------------
    @staticmethod
    def begin(name: str) -> Pattern:
        """The first stage."""
        return Pattern(({"name": name, "contiguity": "begin"},))

    def next(self, name: str) -> Pattern:
        """A stage whose event comes right after the previous stage's (strict)."""
        return self._stage(name, "next")

    def followed_by(self, name: str) -> Pattern:
        """A stage whose event comes after the previous stage's, other events between
        (relaxed: the first event that fits)."""
        return self._stage(name, "followed_by")

    def followed_by_any(self, name: str) -> Pattern:
        """Like followed_by, but every later event that fits starts another match
        (non-deterministic relaxed)."""
        return self._stage(name, "followed_by_any")

    def not_next(self, name: str) -> Pattern:
        """No event matching this stage right after the previous stage's event."""
        return self._stage(name, "not_next")

    def not_followed_by(self, name: str) -> Pattern:
        """No event matching this stage between the previous stage and the next one
        (at the end of a pattern: within the pattern's ``within``)."""
        return self._stage(name, "not_followed_by")

    def _stage(self, name: str, contiguity: Contiguity) -> Pattern:
        return self._with(stages=(*self._stages, {"name": name, "contiguity": contiguity}))

    # -- conditions ---------------------------------------------------------------------
    def where(self, condition: str) -> Pattern:
        """A Spark SQL condition the last stage's events meet (AND with earlier ones):
        fields of the event, and of what earlier stages matched —
        ``price > first(hot.price)``, ``count(hot) < 5``."""
        current = self._last.get("where")
        combined = condition if current is None else f"({current}) AND ({condition})"
        return self._update(where=combined)

    def or_where(self, condition: str) -> Pattern:
        """An alternative condition (OR with what the stage had)."""
        current = self._last.get("where")
        combined = condition if current is None else f"({current}) OR ({condition})"
        return self._update(where=combined)

    def until(self, condition: str) -> Pattern:
        """Stop a looping stage at the first event meeting ``condition``."""
        return self._update(until=condition)

    # -- quantifiers --------------------------------------------------------------------
    def times(self, low: int, high: int | None = None) -> Pattern:
        """Exactly ``low`` events, or from ``low`` to ``high`` (0 makes it optional)."""
        high = low if high is None else high
        if low == 0:
            return self._update(times=(1, high), optional=True)
        return self._update(times=(low, high))

    def one_or_more(self) -> Pattern:
        return self._update(looping=True, times=(1, 1))

    def times_or_more(self, low: int) -> Pattern:
        return self._update(looping=True, times=(low, low))

    def optional(self) -> Pattern:
        return self._update(optional=True)

    def greedy(self) -> Pattern:
        """Take as many events as possible before moving on."""
        return self._update(greedy=True)

    def consecutive(self) -> Pattern:
        """The stage's events follow each other strictly."""
        return self._update(inner="strict")

    def allow_combinations(self) -> Pattern:
        """Any combination of the stage's fitting events (followed_by_any inside)."""
        return self._update(inner="any")

    # -- the whole pattern --------------------------------------------------------------
    def within(self, duration: str | float) -> Pattern:
        """A match's events lie within ``duration`` of its first event."""
        return self._with(within=parse_duration(duration))

    def no_skip(self) -> Pattern:
        return self._with(skip="no_skip", skip_stage=None)

    def skip_to_next(self) -> Pattern:
        return self._with(skip="skip_to_next", skip_stage=None)

    def skip_past_last_event(self) -> Pattern:
        return self._with(skip="skip_past_last_event", skip_stage=None)

    def skip_to_first(self, stage: str) -> Pattern:
        return self._with(skip="skip_to_first", skip_stage=stage)

    def skip_to_last(self, stage: str) -> Pattern:
        return self._with(skip="skip_to_last", skip_stage=stage)

    def spec(self) -> PatternSpec:
        """The validated pattern (SpecError names the stage and the problem)."""
        data = self.to_dict()
        try:
            return PatternSpec.model_validate(data)
        except ValidationError as exc:
            raise SpecError(f"pattern: {_message(exc)}") from None

    def rule(
        self, name: str, *, select: dict[str, str] | None = None, timeouts: bool = False
    ) -> RuleSpec:
        """This pattern as a named rule (for ``match(rules=...)`` and rule sets)."""
        try:
            return RuleSpec(
                name=name, pattern=self.spec(), select=dict(select or {}), timeouts=timeouts
            )
        except ValidationError as exc:
            raise SpecError(f"rule {name!r}: {_message(exc)}") from None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stages": [dict(s) for s in self._stages], "skip": self._skip}
        if self._within is not None:
            out["within"] = self._within
        if self._skip_stage is not None:
            out["skip_stage"] = self._skip_stage
        return out

    # -- helpers ------------------------------------------------------------------------
    @property
    def _last(self) -> dict[str, Any]:
        return self._stages[-1]

    def _update(self, **changes: Any) -> Pattern:
        return self._with(stages=(*self._stages[:-1], {**self._last, **changes}))

    def _with(self, **changes: Any) -> Pattern:
        current = {
            "stages": self._stages,
            "within": self._within,
            "skip": self._skip,
            "skip_stage": self._skip_stage,
        }
        return Pattern(**{**current, **changes})

    def __repr__(self) -> str:
        return f"Pattern({self.to_dict()!r})"


def _message(exc: ValidationError) -> str:
    """A pydantic error about a pattern as one line naming the stage."""
    parts = []
    for error in exc.errors():
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        location = [str(p) for p in error.get("loc", ())]
        if len(location) >= 2 and location[0] == "stages":
            message = f"stages[{location[1]}].{'.'.join(location[2:])}: {message}"
        parts.append(message)
    return "; ".join(parts)
