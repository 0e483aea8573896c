"""Complex event patterns, as data: FlinkCEP's vocabulary in a plain, validated model.

A pattern is a sequence of named stages. Each stage after the first says how it
follows the one before (its *contiguity*), what an event must satisfy (a Spark SQL
condition, see :mod:`spanflow.spec.expressions`) and how many events it takes (its
*quantifier*). ``within`` bounds a match from its first event; ``skip`` is the
after-match skip strategy. :mod:`spanflow.cep.nfa` compiles it into an NFA;
:mod:`spanflow.api.patterns` is the fluent front end
(``Pattern.begin("hot").where("t > 80").followed_by("drop")...``).

The rules FlinkCEP enforces when a pattern is built are checked here, naming the
stage (and one of spanflow's own, marked): a pattern starts with a positive stage;
``not_next``/``not_followed_by`` stages take no quantifier and cannot follow an
optional stage; a pattern ending in ``not_followed_by`` needs ``within``;
``greedy``, ``consecutive`` and ``allow_combinations`` apply to ``times``/looping
stages only; ``until`` to looping stages only; no greedy last stage (spanflow's:
older FlinkCEP refused it too, current Flink accepts it and spanflow's NFA does not
implement it yet); no optional stage right after a greedy one;
``skip_to_first``/``skip_to_last`` name a stage of the pattern.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spanflow.spec.durations import Duration
from spanflow.spec.expressions import ExpressionError, compile_expression

Contiguity = Literal[
    "begin", "next", "followed_by", "followed_by_any", "not_next", "not_followed_by"
]
Inner = Literal["relaxed", "strict", "any"]
"""Between the events of one looping/times stage: followed-by (default), ``consecutive``
(strict) or ``allow_combinations`` (followed-by-any)."""
Skip = Literal["no_skip", "skip_to_next", "skip_past_last_event", "skip_to_first", "skip_to_last"]

STAGE_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
_NAME = re.compile(STAGE_NAME)
NEGATIVE = ("not_next", "not_followed_by")


class PatternError(ValueError):
    """A malformed pattern (the message names the stage and the problem)."""


class StageSpec(BaseModel):
    """One stage of a pattern."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=STAGE_NAME)
    contiguity: Contiguity = "followed_by"
    where: str | None = Field(
        default=None, description="Spark SQL condition on the event (none: every event)."
    )
    times: tuple[int, int] | None = Field(
        default=None, description="(fewest, most) events; None: exactly one (or looping)."
    )
    looping: bool = Field(default=False, description="one_or_more / times_or_more(n).")
    optional: bool = False
    greedy: bool = False
    inner: Inner = "relaxed"
    until: str | None = Field(default=None, description="Stops a looping stage (SQL).")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """YAML's spellings of the fluent API: ``stage``, ``times: 3`` or ``[2, 4]``,
        ``one_or_more``, ``times_or_more``, ``consecutive``, ``allow_combinations``,
        ``or_where`` (a condition or a list of them)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "stage" in data:
            data.setdefault("name", data.pop("stage"))
        times = data.get("times")
        if isinstance(times, int) and not isinstance(times, bool):
            data["times"] = (times, times)
        elif isinstance(times, list | tuple) and len(times) == 2 and times[0] == 0:
            data["times"], data["optional"] = (1, times[1]), True
        if data.pop("one_or_more", False):
            data["looping"], data["times"] = True, (1, 1)
        more = data.pop("times_or_more", None)
        if more is not None:
            data["looping"], data["times"] = True, (more, more)
        if data.pop("consecutive", False):
            data["inner"] = "strict"
        if data.pop("allow_combinations", False):
            data["inner"] = "any"
        alternatives = data.pop("or_where", None)
        if alternatives is not None:
            alternatives = [alternatives] if isinstance(alternatives, str) else alternatives
            parts = [data["where"], *alternatives] if data.get("where") else list(alternatives)
            data["where"] = " OR ".join(f"({p})" for p in parts)
        return data

    @property
    def negative(self) -> bool:
        return self.contiguity in NEGATIVE

    @property
    def quantified(self) -> bool:
        return self.looping or self.times is not None

    @property
    def bounds(self) -> tuple[int, int]:
        """(fewest, most) events of a times/looping stage (most = fewest when looping)."""
        return self.times or (1, 1)

    def describe(self) -> str:
        parts = [self.contiguity, repr(self.name)]
        if self.looping:
            parts.append(f"times_or_more({self.bounds[0]})")
        elif self.times is not None:
            parts.append(f"times{self.times}")
        for flag in ("optional", "greedy"):
            if getattr(self, flag):
                parts.append(flag)
        return " ".join(parts)


class PatternSpec(BaseModel):
    """A sequence of stages, a time bound and an after-match skip strategy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stages: tuple[StageSpec, ...] = Field(min_length=1)
    within: Duration | None = Field(default=None, gt=0, description="From the first event.")
    skip: Skip = "no_skip"
    skip_stage: str | None = Field(
        default=None, description="The stage skip_to_first/skip_to_last skip to."
    )

    @model_validator(mode="before")
    @classmethod
    def _first_begins(cls, data: Any) -> Any:
        """In YAML the first stage need not say ``contiguity: begin``."""
        if isinstance(data, dict) and isinstance(data.get("stages"), list) and data["stages"]:
            first = data["stages"][0]
            if isinstance(first, dict) and "contiguity" not in first:
                data = {**data, "stages": [{**first, "contiguity": "begin"}, *data["stages"][1:]]}
        return data

    @model_validator(mode="after")
    def _valid(self) -> PatternSpec:
        check_pattern(self)
        return self

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    @property
    def positive_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages if not s.negative)

    def stage_prints(self) -> tuple[str, ...]:
        """One fingerprint per stage, in order: a new version whose stages begin with an
        old one's may carry on its partial matches (:mod:`spanflow.cep.processor`)."""
        return tuple(_print(s.model_dump_json()) for s in self.stages)

    def frame_print(self) -> str:
        """The fingerprint of all but the stages (``within``, the skip strategy)."""
        return _print(self.model_dump_json(exclude={"stages"}))

    @property
    def extendable(self) -> bool:
        """Whether a partial match waiting for the last stage means the same in a
        pattern with stages appended: the last stage is one plain event (no loop, no
        count, not optional, not a negation)."""
        last = self.stages[-1]
        return not (last.looping or last.times or last.optional or last.negative)


def _print(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_pattern(pattern: PatternSpec) -> None:
    """Raise :class:`PatternError` naming the stage when ``pattern`` is malformed."""
    seen: set[str] = set()
    for i, stage in enumerate(pattern.stages):
        _check_stage(pattern, i, stage, seen)
        _check_conditions(pattern, i, stage)
        seen.add(stage.name)
    last = pattern.stages[-1]
    if last.contiguity == "not_followed_by" and pattern.within is None:
        raise PatternError(
            f"stage {last.name!r}: a pattern that ends with not_followed_by needs within "
            "(how long the absence must last)"
        )
    if last.greedy:
        raise PatternError(
            f"stage {last.name!r}: a greedy stage cannot end a pattern in spanflow (yet); "
            "finish with a simple stage or drop greedy"
        )
    if pattern.skip in ("skip_to_first", "skip_to_last"):
        if pattern.skip_stage is None:
            raise PatternError(f"{pattern.skip} needs the stage to skip to")
        if pattern.skip_stage not in pattern.positive_names:
            raise PatternError(
                f"{pattern.skip}({pattern.skip_stage!r}): no such stage "
                f"(stages: {', '.join(pattern.positive_names)})"
            )
    elif pattern.skip_stage is not None:
        raise PatternError(f"skip_stage is for skip_to_first/skip_to_last, not {pattern.skip}")


def _check_stage(pattern: PatternSpec, i: int, stage: StageSpec, seen: set[str]) -> None:
    where = f"stage {stage.name!r}"
    if stage.name in seen:
        raise PatternError(f"{where}: the name is used twice")
    if i == 0 and stage.contiguity != "begin":
        if stage.negative:
            raise PatternError(f"{where}: a pattern cannot start with {stage.contiguity}")
        raise PatternError(f"{where}: the first stage begins the pattern (contiguity 'begin')")
    if i > 0 and stage.contiguity == "begin":
        raise PatternError(f"{where}: only the first stage is 'begin'")
    if stage.times is not None:
        low, high = stage.times
        if low < 1 or high < low:
            raise PatternError(f"{where}: times({low}, {high}) needs 1 <= fewest <= most")
    if stage.negative and (stage.quantified or stage.optional or stage.greedy):
        raise PatternError(f"{where}: {stage.contiguity} takes no quantifier, optional or greedy")
    if stage.negative and i > 0 and pattern.stages[i - 1].optional:
        raise PatternError(
            f"{where}: {stage.contiguity} after the optional stage "
            f"{pattern.stages[i - 1].name!r} is not supported (as in FlinkCEP: write two "
            "patterns, one with and one without the optional stage)"
        )
    if not stage.quantified and (stage.greedy or stage.inner != "relaxed"):
        option = "greedy" if stage.greedy else _inner_name(stage.inner)
        raise PatternError(f"{where}: {option} applies to times/one_or_more stages only")
    if stage.until is not None and not stage.looping:
        raise PatternError(f"{where}: until applies to one_or_more/times_or_more stages only")
    if stage.optional and i > 0 and pattern.stages[i - 1].greedy:
        raise PatternError(
            f"{where}: an optional stage cannot follow the greedy stage "
            f"{pattern.stages[i - 1].name!r} (as in FlinkCEP)"
        )
    if not _NAME.match(stage.name):
        raise PatternError(f"{where}: a stage name is a letter or _ then letters, digits or _")


def visible_stages(pattern: PatternSpec, index: int) -> set[str]:
    """The stages a condition of stage ``index`` may read: the positive stages before
    it, and itself when positive (a looping stage reads what it took so far)."""
    out = {s.name for s in pattern.stages[:index] if not s.negative}
    if not pattern.stages[index].negative:
        out.add(pattern.stages[index].name)
    return out


def _check_conditions(pattern: PatternSpec, index: int, stage: StageSpec) -> None:
    visible = visible_stages(pattern, index)
    for what, text in (("where", stage.where), ("until", stage.until)):
        if text is None:
            continue
        try:
            compile_expression(text, stages=visible)
        except ExpressionError as exc:
            raise PatternError(f"stage {stage.name!r}, {what}: {exc}") from None


def gate(pattern: PatternSpec) -> str | None:
    """A SQL condition an event must meet to start a match (None: any event may):
    the OR of what the stages reachable from the start take — the first stage, and
    the next ones while those before are optional. An event that fails it leaves an
    idle NFA unchanged, so it need not be fed to it.

    >>> spec = PatternSpec.model_validate({"stages": [
    ...     {"name": "a", "where": "t > 1", "optional": True},
    ...     {"name": "b", "where": "t < 0"}, {"name": "c"}]})
    >>> gate(spec)
    '((t > 1)) OR ((t < 0))'
    """
    parts: list[str] = []
    for i, stage in enumerate(pattern.stages):
        if stage.negative:
            break
        if stage.where is None:
            return None
        if compile_expression(stage.where, stages=visible_stages(pattern, i)).stages:
            return None  # reads what it matched: cannot be decided from the event alone
        take = f"({stage.where})"
        if stage.until is not None:
            take = f"{take} AND NOT ({stage.until})"
        parts.append(f"({take})")
        if not stage.optional:
            break
    return " OR ".join(parts) if parts else None


def _inner_name(inner: Inner) -> str:
    return {"strict": "consecutive", "any": "allow_combinations", "relaxed": "followed_by"}[inner]


RULE_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
RESERVED_FIELDS = ("rule", "version", "match_start", "match_end", "timed_out", "values")
"""Fields every match row may have: a selection cannot take these names."""


class RuleSpec(BaseModel):
    """A named pattern with what its match rows carry: one rule of a pattern step or
    of a versioned rule set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=RULE_NAME)
    pattern: PatternSpec
    select: dict[str, str] = Field(
        default_factory=dict,
        description="Output field → Spark SQL over the match (default: each stage's count).",
    )
    timeouts: bool = Field(default=False, description="Also emit timed-out partial matches.")

    @model_validator(mode="after")
    def _valid(self) -> RuleSpec:
        taken = [n for n in self.select if n in RESERVED_FIELDS]
        if taken:
            raise PatternError(
                f"rule {self.name!r}, select: {taken} are fields every match row has; "
                "pick other names"
            )
        stages = set(self.pattern.positive_names)
        for out, text in self.select.items():
            try:
                compile_expression(text, stages=stages, selection=True)
            except ExpressionError as exc:
                raise PatternError(f"rule {self.name!r}, select {out!r}: {exc}") from None
        return self

    @property
    def selections(self) -> dict[str, str]:
        """``select``, or each stage's event count when it is empty."""
        if self.select:
            return dict(self.select)
        return {f"{n}_count": f"count({n})" for n in self.pattern.positive_names}

    def fingerprint(self) -> str:
        """Equal for equal rules: a rule set's new version keeps the partial matches of
        rules whose fingerprint did not change."""
        import hashlib

        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]
