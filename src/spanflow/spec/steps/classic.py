"""The classic processors of the seed pipeline format — ``forward``, ``sum``, ``count``
and ``average`` — as sugar over core steps.

A pipeline keeps them as written (its file or JSON round-trips unchanged); the
planner and the Spark compiler only ever see what :meth:`~StepBase.expand` returns.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spanflow.spec.durations import Duration
from spanflow.spec.steps.base import StepBase, derived_id
from spanflow.spec.steps.keyed import AggregateStep
from spanflow.spec.steps.stateless import KeyByStep, MapStep, SelectStep
from spanflow.spec.steps.windows import WindowStep


def _keyed(step: StepBase, key: str | None) -> tuple[tuple[StepBase, ...], tuple[str, ...]]:
    """A key_by in front of ``step`` when the step names its own key: (steps, inputs)."""
    if key is None:
        return (), step.inputs
    key_by = KeyByStep(id=derived_id(step.id, "key"), inputs=step.inputs, key=(key,))
    return (key_by,), (key_by.id,)


class ForwardStep(StepBase):
    """Passes records on unchanged (the classic 'forward' processor)."""

    type: Literal["forward"] = "forward"

    def expand(self) -> tuple[StepBase, ...]:
        return (SelectStep(id=self.id, inputs=self.inputs, columns=("*",), **self.pins()),)


class SumStep(StepBase):
    """Adds a constant to a numeric field (the classic 'sum' processor)."""

    type: Literal["sum"] = "sum"
    field: str
    value: float
    output: str | None = Field(default=None, description="Result column (default: 'field').")

    def expand(self) -> tuple[StepBase, ...]:
        # A double constant, as a string cast so that inf and nan stay exact.
        expression = f"`{self.field}` + CAST('{self.value!r}' AS DOUBLE)"
        columns = {self.output or self.field: expression}
        return (
            MapStep(
                id=self.id,
                inputs=self.inputs,
                columns=columns,
                **self.pins(),
            ),
        )


class CountStep(StepBase):
    """A running count of records per key (the classic 'count' processor)."""

    type: Literal["count"] = "count"
    key: str | None = Field(default=None, description="Default: the stream's key.")

    def expand(self) -> tuple[StepBase, ...]:
        before, inputs = _keyed(self, self.key)
        count = AggregateStep(
            id=self.id,
            inputs=inputs,
            aggregates={"count": "count"},
            **self.pins(),
        )
        return (*before, count)


class AverageStep(StepBase):
    """The average of a field per tumbling event-time window (the classic 'average')."""

    type: Literal["average"] = "average"
    field: str
    window: Duration = Field(gt=0)
    key: str | None = Field(default=None, description="Default: the stream's key, if any.")

    def expand(self) -> tuple[StepBase, ...]:
        before, inputs = _keyed(self, self.key)
        window = WindowStep(
            id=self.id,
            inputs=inputs,
            kind="tumbling",
            size=self.window,
            aggregates={"average": f"avg({self.field})"},
            **self.pins(),
        )
        return (*before, window)
