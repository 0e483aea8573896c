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
from spanflow.spec.steps.keyed import AggregateStep, RunningStep
from spanflow.spec.steps.stateless import EventTimeStep, KeyByStep, MapStep, SelectStep
from spanflow.spec.steps.windows import WindowStep

DEFAULT_AVERAGE_WINDOW = 10.0
"""Seconds: the tumbling window of a seed-format ``average`` that names none."""


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
    """Adds a constant to a numeric field (the classic 'sum' processor): by default 1
    to ``value``, one record out per record."""

    type: Literal["sum"] = "sum"
    field: str = Field(default="value", description="The numeric field added to.")
    value: float = Field(default=1.0, description="The constant added.")
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
    """A count of records per key (the classic 'count' processor).

    ``emit: updates`` (the default) writes each changed key's count in ``count`` after
    every micro-batch; ``emit: records`` passes every record on with ``output`` set to
    the count of its key's records so far (the seed format's ``count``: one record out
    per record, in arrival order per key)."""

    type: Literal["count"] = "count"
    key: str | None = Field(default=None, description="Default: the stream's key.")
    emit: Literal["updates", "records"] = "updates"
    output: str = Field(default="count", description="The count's field (emit: records).")

    def expand(self) -> tuple[StepBase, ...]:
        before, inputs = _keyed(self, self.key)
        if self.emit == "records":
            running = RunningStep(
                id=self.id, inputs=inputs, fn="count", output=self.output, **self.pins()
            )
            return (*before, running)
        count = AggregateStep(
            id=self.id,
            inputs=inputs,
            aggregates={"count": "count"},
            **self.pins(),
        )
        return (*before, count)


class AverageStep(StepBase):
    """The average of a field per key and tumbling event-time window (the classic
    'average'): one record per window, written when the watermark passes its end.

    ``time`` names the event-time field here (with ``lateness``, how late a record may
    come), for an input that has none yet; without it the input's event time counts."""

    type: Literal["average"] = "average"
    field: str
    window: Duration = Field(gt=0)
    key: str | None = Field(default=None, description="Default: the stream's key, if any.")
    output: str = Field(default="average", description="The average's field.")
    time: str | None = Field(default=None, description="Event-time field (default: the input's).")
    lateness: Duration = Field(default=0.0, ge=0, le=86400)

    def expand(self) -> tuple[StepBase, ...]:
        before, inputs = _keyed(self, self.key)
        if self.time is not None:
            timed = EventTimeStep(
                id=derived_id(self.id, "time"),
                inputs=inputs,
                field=self.time,
                max_out_of_orderness=self.lateness,
            )
            before, inputs = (*before, timed), (timed.id,)
        window = WindowStep(
            id=self.id,
            inputs=inputs,
            kind="tumbling",
            size=self.window,
            aggregates={self.output: f"avg({self.field})"},
            **self.pins(),
        )
        return (*before, window)
