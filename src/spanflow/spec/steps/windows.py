"""Windows: event-time windows (tumbling, sliding, session), count windows, and the
merge of per-site partial window aggregates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from spanflow.spec.aggregates import check_aggregates
from spanflow.spec.durations import Duration
from spanflow.spec.steps.base import (
    NO_NODE_PINS,
    FunctionRef,
    Placement,
    Split,
    StepBase,
    StreamFacts,
    derived_id,
)

WATERMARK_EPSILON = 0.001
"""Seconds of out-of-orderness allowed on ``window_end`` when window results cross to
another site: every row of a window arrives with the same ``window_end``, possibly
across micro-batches, and must not count as late."""


def _keyed_result(
    inputs: Sequence[StreamFacts], event_time: tuple[str, float] | None
) -> StreamFacts:
    """Facts of a per-key result: the key stays, only key fields still say where a
    record is born."""
    up = inputs[0]
    return StreamFacts(
        key=up.key, entity=frozenset(f for f in up.entity if f in up.key), event_time=event_time
    )


class WindowStep(StepBase):
    """Groups records per key into event-time windows and aggregates each window.

    ``kind`` is tumbling (``size``), sliding (``size`` and ``slide``) or session
    (``gap``). Either ``aggregates`` (name → ``count``, ``sum(f)``, ``avg(f)``,
    ``min(f)``, ``max(f)``) or ``reduce`` (a Python function (acc, record) → acc).
    ``emit: final`` writes each window once, when the watermark passes its end;
    ``updates`` writes the changed windows after every micro-batch.
    """

    placement: ClassVar[Placement] = Placement.KEYED
    upgrade_free: ClassVar[frozenset[str]] = frozenset({"allowed_lateness"})
    """It moves the query's watermark, which Spark reads from the offset log anew."""

    type: Literal["window"] = "window"
    kind: Literal["tumbling", "sliding", "session"] = "tumbling"
    size: Duration | None = Field(default=None, gt=0)
    slide: Duration | None = Field(default=None, gt=0)
    gap: Duration | None = Field(default=None, gt=0)
    aggregates: dict[str, str] | None = None
    reduce: FunctionRef | None = None
    emit: Literal["final", "updates"] = "final"
    allowed_lateness: Duration = Field(
        default=0.0,
        ge=0,
        le=86400,
        description="How much longer than the stream's max_out_of_orderness a window "
        "waits for late records before it is written (its query's watermark waits as long).",
    )
    partial: bool = Field(
        default=False,
        description="Set by the planner: emit mergeable partial aggregates "
        "(see partial_columns) for a merge step at another site.",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """Accept ``tumbling: 10s``, ``sliding: {size, slide}`` and ``session: 30s``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "tumbling" in data:
            data.setdefault("kind", "tumbling")
            data["size"] = data.pop("tumbling")
        elif "sliding" in data:
            spec = data.pop("sliding")
            data.setdefault("kind", "sliding")
            if isinstance(spec, dict):
                data.update(spec)
        elif "session" in data:
            data.setdefault("kind", "session")
            data["gap"] = data.pop("session")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> WindowStep:
        if self.kind in ("tumbling", "sliding") and self.size is None:
            raise ValueError(f"a {self.kind} window needs 'size'")
        if self.kind == "sliding":
            if self.slide is None:
                raise ValueError("a sliding window needs 'slide'")
            if self.size is not None and self.slide > self.size:
                raise ValueError("'slide' cannot be longer than 'size'")
        if self.kind == "session" and self.gap is None:
            raise ValueError("a session window needs 'gap'")
        if (self.aggregates is None) == (self.reduce is None):
            raise ValueError("give exactly one of 'aggregates' or 'reduce'")
        check_aggregates(self.aggregates or {})
        return self

    def state_lateness(self) -> float:
        return float(self.allowed_lateness)

    def keeps_python_state(self) -> bool:
        # a Python reduce over tumbling or sliding windows folds records in keyed state;
        # a session window collects its records and reduces them statelessly
        return self.reduce is not None and self.kind != "session"

    def realtime_problem(self) -> str | None:
        if self.reduce:
            return "its Python reduce runs on micro-batches; use SQL aggregates to run in real time"
        if self.kind == "session":
            return "session windows are not supported by Spark's Real-Time Mode"
        if self.emit != "updates":
            return (
                "emit: final needs append output, which Real-Time Mode does not have; "
                "use emit: updates (every record updates its window at once)"
            )
        return None

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        # Window results carry on in event time as their window's end.
        return _keyed_result(inputs, ("window_end", WATERMARK_EPSILON))

    def split(self, inputs: Sequence[StreamFacts]) -> Split | None:
        """Final count/sum/avg/min/max windows split exactly: each site aggregates its
        own records (avg travels as sum + count) and a merge folds the partials."""
        if self.aggregates is None or self.emit != "final" or self.kind == "session":
            return None
        partial_id = derived_id(self.id, "partial")
        # Pins on a split window hold for its merge; the partial is a cheap
        # pre-aggregation that runs wherever the site's data is.
        partial = self.model_copy(
            update={
                "id": partial_id,
                "partial": True,
                "at": None,
                **NO_NODE_PINS,
            }
        )
        merge = MergeStep(
            id=self.id,
            inputs=(partial_id,),
            key=inputs[0].key,
            aggregates=dict(self.aggregates),
            **self.node_pins(),
        )
        return Split(partial=partial, merge=merge)


class MergeStep(StepBase):
    """Merges the partial aggregates of one window from several sites (set by the planner).

    Groups by the key and the window bounds and folds each partial column; the output
    has the same columns as the unsplit window step it stands for.
    """

    placement: ClassVar[Placement] = Placement.KEYED

    type: Literal["merge"] = "merge"

    def realtime_problem(self) -> str | None:
        return "merging partial windows from several sites runs on micro-batches"

    key: tuple[str, ...] = ()
    aggregates: dict[str, str] = Field(min_length=1)

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        up = inputs[0]
        return StreamFacts(key=self.key, entity=frozenset(f for f in up.entity if f in self.key))

    def state_key(self, inputs: Sequence[StreamFacts]) -> tuple[str, ...]:
        return self.key


class CountWindowStep(StepBase):
    """Groups each key's records into windows of ``size`` records and aggregates each.

    Tumbling without ``slide`` (records 1 to 100, 101 to 200, ...); sliding with it (a window of
    the last ``size`` records every ``slide`` records). A key's records are taken in
    event-time order when the stream has event time, else in arrival order. Results
    are emitted when a window fills; aggregates are kept incrementally (a sliding
    window keeps one partial per ``slide`` records, a reduce keeps the records of one
    window). Built on keyed state: exactly once across restarts.
    """

    placement: ClassVar[Placement] = Placement.KEYED

    def keeps_python_state(self) -> bool:
        return True

    type: Literal["count_window"] = "count_window"
    size: int = Field(ge=1, le=1_000_000, description="Records per window.")
    slide: int | None = Field(
        default=None, ge=1, description="Records between window starts (default: size)."
    )
    aggregates: dict[str, str] | None = None
    reduce: FunctionRef | None = None

    @model_validator(mode="after")
    def _consistent(self) -> CountWindowStep:
        if self.slide is not None and self.slide > self.size:
            raise ValueError("'slide' cannot be larger than 'size'")
        if (self.aggregates is None) == (self.reduce is None):
            raise ValueError("give exactly one of 'aggregates' or 'reduce'")
        check_aggregates(self.aggregates or {})
        return self

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        return _keyed_result(inputs, None)

    def check_inputs(self, inputs: Sequence[StreamFacts]) -> None:
        if not inputs[0].key:
            raise ValueError(
                f"count window {self.id!r} needs a keyed stream: add key_by(...) before it "
                "(or give the source a key)"
            )
