"""The typed steps a pipeline is made of.

One frozen pydantic model per step type, discriminated by ``type``. The same models
validate the fluent API's output, a YAML file and (later) a REST body, so every front
end reports the same errors. Python functions are referenced as ``"module:qualname"``
text — never pickled — and resolved where the pipeline runs.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spanflow.spec.durations import Duration
from spanflow.spec.schema import Schema, StreamFormat

STEP_ID = r"^[A-Za-z_][A-Za-z0-9_-]*$"
FUNCTION_REF = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.<>]*$"

AGGREGATE = re.compile(r"^\s*(count|sum|avg|mean|min|max)\s*(?:\(\s*([A-Za-z_]\w*|\*)?\s*\))?\s*$")
AGGREGATE_FUNCTIONS = ("count", "sum", "avg", "min", "max")


def parse_aggregate(text: str) -> tuple[str, str | None]:
    """``"avg(temperature)"`` → ``("avg", "temperature")``; ``"count"`` → ``("count", None)``."""
    match = AGGREGATE.match(text)
    if not match:
        raise ValueError(f"aggregate {text!r} is not one of count, sum(f), avg(f), min(f), max(f)")
    fn, field = match.group(1), match.group(2)
    fn = "avg" if fn == "mean" else fn
    if field == "*":
        field = None
    if fn != "count" and field is None:
        raise ValueError(f"aggregate {text!r} needs a field, e.g. {fn}(temperature)")
    return fn, field


class _Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=STEP_ID, max_length=64, description="Unique, readable step id.")
    inputs: tuple[str, ...] = Field(default=(), description="Ids of the upstream steps.")
    at: Literal["edge", "cloud"] | None = Field(
        default=None,
        description="Pin: 'edge' runs the step at every site that hosts its input, on that "
        "site's data; 'cloud' runs it (and everything after it) on a cloud node.",
    )
    node_tags: tuple[str, ...] = Field(
        default=(), description="Pin: the step runs on a node with all of these tags."
    )


FunctionRef = Annotated[
    str,
    Field(
        pattern=FUNCTION_REF,
        description="A Python function as 'module:qualname', imported where the pipeline runs.",
    ),
]


class SourceStep(_Step):
    """Reads a JetStream stream and decodes each message into one record."""

    type: Literal["source"] = "source"
    stream: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="JetStream stream name.")
    subjects: tuple[str, ...] | None = Field(
        default=None, description="Subjects the stream captures (created if the stream is missing)."
    )
    format: StreamFormat = Field(default=StreamFormat.JSON, description="Message encoding.")
    schema_: Schema = Field(
        default_factory=dict, alias="schema", description="Field name → type; 'type?' is optional."
    )
    key: str | None = Field(default=None, description="Field that identifies the device/entity.")
    event_time: str | None = Field(default=None, description="Timestamp field for event time.")
    max_out_of_orderness: Duration = Field(
        default=0.0, le=86400, description="How late an event may arrive (the watermark delay)."
    )
    start: Literal["earliest", "latest"] = Field(
        default="earliest", description="Where a new pipeline starts reading the stream."
    )
    max_rows_per_batch: int = Field(
        default=200_000, ge=1, le=10_000_000, description="Admission control per micro-batch."
    )
    partitions: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Read tasks per micro-batch. 1 keeps per-key order for stateless pipelines.",
    )
    csv_delimiter: str = Field(default=",", min_length=1, max_length=1)
    filter_subjects: tuple[str, ...] = Field(
        default=(), description="Read only messages on these subjects (default: all)."
    )
    schema_of: str | None = Field(
        default=None,
        description="Set by the planner: records are the output of this step of the "
        "pipeline, so their schema is that step's (the schema field stays empty).",
    )
    source_domain: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="Set by the planner: the stream is written in this JetStream domain "
        "(another site's server); a reader elsewhere sources it into its own domain.",
    )

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _fields_exist(self) -> SourceStep:
        if self.schema_of is not None:
            return self
        if self.format != StreamFormat.RAW and not self.schema_:
            raise ValueError(f"format {self.format.value} needs a schema (field: type)")
        for name, role in ((self.key, "key"), (self.event_time, "event_time")):
            if name is not None and self.format != StreamFormat.RAW and name not in self.schema_:
                raise ValueError(f"{role} {name!r} is not a field of the schema")
        if self.event_time and self.schema_.get(self.event_time, "timestamp").rstrip("?") != (
            "timestamp"
        ):
            raise ValueError(
                f"event_time {self.event_time!r} must be a timestamp field "
                "(ISO-8601 text or epoch seconds/milliseconds in the message)"
            )
        return self


class FilterStep(_Step):
    """Keeps the records for which a SQL predicate (or a Python function) is true."""

    type: Literal["filter"] = "filter"
    where: str | None = Field(default=None, description="Spark SQL predicate, e.g. 'temp > 30'.")
    function: FunctionRef | None = None

    @model_validator(mode="after")
    def _one_of(self) -> FilterStep:
        if (self.where is None) == (self.function is None):
            raise ValueError("give exactly one of 'where' (SQL) or 'function' (Python)")
        return self


class SelectStep(_Step):
    """Projects records with Spark SQL expressions ('temp * 1.8 + 32 AS temp_f')."""

    type: Literal["select"] = "select"
    columns: tuple[str, ...] = Field(min_length=1)


class MapStep(_Step):
    """Adds or replaces columns with SQL expressions, or maps each record with Python."""

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


class FlatMapStep(_Step):
    """Maps each record to zero or more records with a Python function."""

    type: Literal["flat_map"] = "flat_map"
    function: FunctionRef
    schema_: Schema | None = Field(default=None, alias="schema")
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class KeyByStep(_Step):
    """Sets the key that windows, counts and de-duplication group by."""

    type: Literal["key_by"] = "key_by"
    key: tuple[str, ...] = Field(min_length=1)

    @field_validator("key", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v


class EventTimeStep(_Step):
    """Declares the event-time field and how out of order events may arrive."""

    type: Literal["event_time"] = "event_time"
    field: str
    max_out_of_orderness: Duration = Field(default=0.0, le=86400)


class WindowStep(_Step):
    """Groups records per key into event-time windows and aggregates each window.

    ``kind`` is tumbling (``size``), sliding (``size`` and ``slide``) or session
    (``gap``). Either ``aggregates`` (name → ``count``, ``sum(f)``, ``avg(f)``,
    ``min(f)``, ``max(f)``) or ``reduce`` (a Python function (acc, record) → acc).
    ``emit: final`` writes each window once, when the watermark passes its end;
    ``updates`` writes the changed windows after every micro-batch.
    """

    type: Literal["window"] = "window"
    kind: Literal["tumbling", "sliding", "session"] = "tumbling"
    size: Duration | None = Field(default=None, gt=0)
    slide: Duration | None = Field(default=None, gt=0)
    gap: Duration | None = Field(default=None, gt=0)
    aggregates: dict[str, str] | None = None
    reduce: FunctionRef | None = None
    emit: Literal["final", "updates"] = "final"
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
        for name, text in (self.aggregates or {}).items():
            if not re.match(r"^[A-Za-z_]\w*$", name):
                raise ValueError(f"aggregate name {name!r} must be an identifier")
            parse_aggregate(text)
        return self


def partial_columns(name: str, text: str) -> dict[str, str]:
    """The columns a partial window emits for one aggregate, and how the merge folds each.

    ``avg`` travels as a sum and a count so that the merge is exact.

    >>> partial_columns("t", "avg(temp)")
    {'t__sum': 'sum', 't__count': 'sum'}
    >>> partial_columns("n", "count")
    {'n': 'sum'}
    """
    fn, _ = parse_aggregate(text)
    if fn == "avg":
        return {f"{name}__sum": "sum", f"{name}__count": "sum"}
    return {name: {"count": "sum", "sum": "sum", "min": "min", "max": "max"}[fn]}


class MergeStep(_Step):
    """Merges the partial aggregates of one window from several sites (set by the planner).

    Groups by the key and the window bounds and folds each partial column; the output
    has the same columns as the unsplit window step it stands for.
    """

    type: Literal["merge"] = "merge"
    key: tuple[str, ...] = ()
    aggregates: dict[str, str] = Field(min_length=1)


class UnionStep(_Step):
    """Records of all inputs in one stream; the inputs must have the same columns."""

    type: Literal["union"] = "union"


class DeduplicateStep(_Step):
    """Drops a record whose key was already seen within ``within`` (event time)."""

    type: Literal["deduplicate"] = "deduplicate"
    key: tuple[str, ...] = Field(min_length=1)
    within: Duration = Field(gt=0, le=86400 * 7)

    @field_validator("key", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v


class ForwardStep(_Step):
    """Passes records on unchanged (the classic 'forward' processor)."""

    type: Literal["forward"] = "forward"


class SumStep(_Step):
    """Adds a constant to a numeric field (the classic 'sum' processor)."""

    type: Literal["sum"] = "sum"
    field: str
    value: float
    output: str | None = Field(default=None, description="Result column (default: 'field').")


class CountStep(_Step):
    """A running count of records per key (the classic 'count' processor)."""

    type: Literal["count"] = "count"
    key: str | None = Field(default=None, description="Default: the stream's key.")


class AverageStep(_Step):
    """The average of a field per tumbling event-time window (the classic 'average')."""

    type: Literal["average"] = "average"
    field: str
    window: Duration = Field(gt=0)
    key: str | None = Field(default=None, description="Default: the stream's key, if any.")


class SinkStep(_Step):
    """Writes records out: a JetStream stream, Parquet files or the console."""

    type: Literal["sink"] = "sink"
    kind: Literal["jetstream", "parquet", "console"] = "jetstream"
    stream: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]+$")
    subject: str | None = None
    path: str | None = None
    order_by: str | None = Field(
        default=None, description="Field that orders records of one key within a batch."
    )
    trigger: Duration | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="Micro-batch interval of this sink's query; default: the pipeline's. "
        "A sink of 10 s windows needs no 2 s batches, and each batch costs a small node "
        "the same fixed planning and checkpointing work.",
    )

    @model_validator(mode="after")
    def _target(self) -> SinkStep:
        if self.kind == "jetstream" and not (self.stream and self.subject):
            raise ValueError("a jetstream sink needs 'stream' and 'subject'")
        if self.kind == "parquet" and not self.path:
            raise ValueError("a parquet sink needs 'path'")
        return self


Step = Annotated[
    SourceStep
    | FilterStep
    | SelectStep
    | MapStep
    | FlatMapStep
    | KeyByStep
    | EventTimeStep
    | WindowStep
    | DeduplicateStep
    | ForwardStep
    | SumStep
    | CountStep
    | AverageStep
    | MergeStep
    | UnionStep
    | SinkStep,
    Field(discriminator="type"),
]

STEP_TYPES = (
    "source",
    "filter",
    "select",
    "map",
    "flat_map",
    "key_by",
    "event_time",
    "window",
    "deduplicate",
    "forward",
    "sum",
    "count",
    "average",
    "merge",
    "union",
    "sink",
)
