"""Steps that keep state per key: de-duplication, running aggregates and keyed
process functions (users' own state and timers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from spanflow.spec.aggregates import check_aggregates
from spanflow.spec.durations import Duration
from spanflow.spec.schema import Schema
from spanflow.spec.steps.base import FunctionRef, Placement, StepBase, StreamFacts, one_or_many


def _needs_key(step: StepBase, inputs: Sequence[StreamFacts], what: str) -> None:
    if not inputs[0].key:
        raise ValueError(
            f"{what} {step.id!r} needs a keyed stream: add key_by(...) before it "
            "(or give the source a key)"
        )


class DeduplicateStep(StepBase):
    """Drops a record whose key was already seen within ``within`` (event time)."""

    placement: ClassVar[Placement] = Placement.KEYED

    type: Literal["deduplicate"] = "deduplicate"
    key: tuple[str, ...] = Field(min_length=1)
    within: Duration = Field(gt=0, le=86400 * 7)

    @field_validator("key", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return one_or_many(v)

    def state_key(self, inputs: Sequence[StreamFacts]) -> tuple[str, ...]:
        return self.key

    def state_horizon(self) -> float:
        return self.within

    def realtime_problem(self) -> str | None:
        return None  # compiled as dropDuplicates(key + event time) in real time


class AggregateStep(StepBase):
    """Running aggregates per key over the whole stream (no window); emits the changed
    keys' values after every micro-batch (update output)."""

    placement: ClassVar[Placement] = Placement.KEYED

    type: Literal["aggregate"] = "aggregate"
    aggregates: dict[str, str] = Field(
        min_length=1, description="Output column → count, sum(f), avg(f), min(f) or max(f)."
    )

    @model_validator(mode="after")
    def _valid(self) -> AggregateStep:
        check_aggregates(self.aggregates)
        return self

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        up = inputs[0]
        return StreamFacts(key=up.key, entity=frozenset(f for f in up.entity if f in up.key))

    def realtime_problem(self) -> str | None:
        return None


TimeMode = Literal["event_time", "processing_time", "none"]


class ProcessStep(StepBase):
    """Runs a user's :class:`spanflow.KeyedProcessor` per key, with its own state and
    timers, on Spark's ``transformWithState`` (RocksDB state, checkpointed).

    ``processor`` names the class as ``module:Class``. ``output_schema`` is the schema
    of the rows it emits. ``timers`` chooses the clock of its timers: event time (the
    default when the stream has event time) or processing time; Spark allows one per
    processor. A processor that raises on a key sends that key's rows of the batch to
    the dead-letter stream and leaves its state as it was.
    """

    placement: ClassVar[Placement] = Placement.KEYED

    def keeps_python_state(self) -> bool:
        return True

    type: Literal["process"] = "process"
    processor: FunctionRef = Field(description="The KeyedProcessor class, 'module:Class'.")
    output_schema: Schema = Field(min_length=1, description="Field name → type of emitted rows.")
    timers: TimeMode | None = Field(
        default=None,
        description="Clock of timers and of TTL: event_time, processing_time or none "
        "(default: event_time when the stream has event time, else processing_time).",
    )
    output_event_time: str | None = Field(
        default=None,
        description="A timestamp field of the output that carries event time on "
        "(event-time processors only).",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the processor's constructor (plain data).",
    )
    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="after")
    def _valid(self) -> ProcessStep:
        if self.output_event_time is not None:
            declared = self.output_schema.get(self.output_event_time)
            if declared is None or declared.rstrip("?") != "timestamp":
                raise ValueError(
                    f"output_event_time {self.output_event_time!r} must be a timestamp "
                    "field of output_schema"
                )
            if self.timers in ("processing_time", "none"):
                raise ValueError("output_event_time needs event-time timers (timers: event_time)")
        return self

    def check_inputs(self, inputs: Sequence[StreamFacts]) -> None:
        _needs_key(self, inputs, "process")
        if self.timers == "event_time" and inputs[0].event_time is None:
            raise ValueError(
                f"process {self.id!r} uses event-time timers but its input has no event time: "
                "set event_time on the source or add with_event_time(...) before it"
            )

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        up = inputs[0]
        fields = self.output_schema
        return StreamFacts(
            key=up.key if all(k in fields for k in up.key) else (),
            entity=frozenset(f for f in up.entity if f in fields),
            event_time=(self.output_event_time, 0.0) if self.output_event_time else None,
        )


class RunningStep(StepBase):
    """A running aggregate emitted with every record: each output record is its input
    record with ``output`` set to the aggregate of all records so far (of its key, or
    of the whole stream without a key), in event-time order (arrival order without).

    The classic processors of the seed pipeline format: ``sum``, ``count`` and
    ``average`` without parameters are running aggregates of the field ``value``.
    """

    placement: ClassVar[Placement] = Placement.KEYED

    def keeps_python_state(self) -> bool:
        return True

    type: Literal["running"] = "running"
    fn: Literal["sum", "count", "avg", "min", "max"] = Field(description="The aggregate.")
    field: str = Field(default="value", description="The field aggregated (not for count).")
    output: str | None = Field(default=None, description="Result field (default: 'field').")

    @property
    def target(self) -> str:
        return self.output or self.field

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        up = inputs[0]
        return StreamFacts(
            key=up.key if self.target not in up.key else (),
            entity=frozenset(f for f in up.entity if f != self.target),
            event_time=up.event_time,
        )
