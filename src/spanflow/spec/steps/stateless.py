"""Record-at-a-time steps: filter, select, map, flat_map, key_by, event_time, union.

None of them keeps state, so each runs wherever its input is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from spanflow.spec.durations import Duration
from spanflow.spec.schema import Schema
from spanflow.spec.steps.base import FunctionRef, Rate, StepBase, StreamFacts, one_or_many


class FilterStep(StepBase):
    """Keeps the records for which a SQL predicate (or a Python function) is true."""

    rate: ClassVar[Rate] = Rate.AT_MOST

    type: Literal["filter"] = "filter"
    where: str | None = Field(default=None, description="Spark SQL predicate, e.g. 'temp > 30'.")
    function: FunctionRef | None = None

    @model_validator(mode="after")
    def _one_of(self) -> FilterStep:
        if (self.where is None) == (self.function is None):
            raise ValueError("give exactly one of 'where' (SQL) or 'function' (Python)")
        return self

    def realtime_problem(self) -> str | None:
        if self.function:
            return "its Python function runs on micro-batches; write it as SQL to run in real time"
        return None


class SelectStep(StepBase):
    """Projects records with Spark SQL expressions ('temp * 1.8 + 32 AS temp_f')."""

    rate: ClassVar[Rate] = Rate.KEEPS

    type: Literal["select"] = "select"
    columns: tuple[str, ...] = Field(min_length=1)

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        up = inputs[0]
        if "*" in (c.strip() for c in self.columns):
            return up
        kept = {c.strip() for c in self.columns}
        event_time = up.event_time if up.event_time and up.event_time[0] in kept else None
        return StreamFacts(
            key=up.key if all(k in kept for k in up.key) else (),
            entity=frozenset(f for f in up.entity if f in kept),
            event_time=event_time,
        )

    def realtime_problem(self) -> str | None:
        return None


class MapStep(StepBase):
    """Adds or replaces columns with SQL expressions, or maps each record with Python."""

    rate: ClassVar[Rate] = Rate.KEEPS

    type: Literal["map"] = "map"
    columns: dict[str, str] | None = Field(
        default=None, description="Column name → Spark SQL expression."
    )
    function: FunctionRef | None = Field(default=None, description="Python function: dict → dict.")
    schema_: Schema | None = Field(
        default=None,
        alias="schema",
        description="Output schema of the function (default: same as the input).",
    )
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _one_of(self) -> MapStep:
        if (self.columns is None) == (self.function is None):
            raise ValueError("give exactly one of 'columns' (SQL) or 'function' (Python)")
        return self

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        up = inputs[0]
        replaced = set(self.columns or {})
        if self.function and self.schema_ is not None:
            replaced |= {f for f in up.entity if f not in self.schema_}
        return replace(up, entity=frozenset(f for f in up.entity if f not in replaced))

    def realtime_problem(self) -> str | None:
        if self.function:
            return "its Python function runs on micro-batches; write it as SQL to run in real time"
        return None


class FlatMapStep(StepBase):
    """Maps each record to zero or more records with a Python function."""

    type: Literal["flat_map"] = "flat_map"
    function: FunctionRef
    schema_: Schema | None = Field(default=None, alias="schema")
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        up = inputs[0]
        if self.schema_ is None:
            return up
        return replace(up, entity=frozenset(f for f in up.entity if f in self.schema_))


class KeyByStep(StepBase):
    """Sets the key that windows, counts, processors and de-duplication group by."""

    rate: ClassVar[Rate] = Rate.KEEPS

    type: Literal["key_by"] = "key_by"
    key: tuple[str, ...] = Field(min_length=1)

    @field_validator("key", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return one_or_many(v)

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        return replace(inputs[0], key=self.key)

    def realtime_problem(self) -> str | None:
        return None


class EventTimeStep(StepBase):
    """Declares the event-time field and how out of order events may arrive."""

    rate: ClassVar[Rate] = Rate.KEEPS

    type: Literal["event_time"] = "event_time"
    field: str
    max_out_of_orderness: Duration = Field(default=0.0, le=86400)

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        return replace(inputs[0], event_time=(self.field, self.max_out_of_orderness))

    def realtime_problem(self) -> str | None:
        return None


class UnionStep(StepBase):
    """Records of all inputs in one stream; the inputs must have the same columns,
    unless ``allow_missing``: then a column some inputs lack is null in their records."""

    rate: ClassVar[Rate] = Rate.SUMS

    arity: ClassVar[tuple[int, int | None]] = (2, None)

    type: Literal["union"] = "union"
    allow_missing: bool = False

    def realtime_problem(self) -> str | None:
        return None
