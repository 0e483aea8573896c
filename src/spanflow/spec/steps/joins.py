"""Joins: two streams on a key within an event-time interval, and a stream with a table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spanflow.spec.durations import Duration, SignedDuration
from spanflow.spec.schema import Schema
from spanflow.spec.steps.base import Placement, Rate, StepBase, StreamFacts, one_or_many


class JoinStep(StepBase):
    """Joins each record of the first input (left) with the records of the second
    (right) that have the same ``on`` fields and whose event time lies within
    ``[left time + lower, left time + upper]``.

    ``how: inner`` emits matched pairs; ``left`` also emits each left record that found
    no match, with nulls for the right side, once the watermark shows no match can
    come. Both inputs need event time. The output has the left record's columns, then
    the right record's (the ``on`` fields once; a right column whose name the left
    side already uses gets ``suffix``). Its event time is the left record's.
    """

    arity: ClassVar[tuple[int, int | None]] = (2, 2)
    placement: ClassVar[Placement] = Placement.KEYED

    type: Literal["join"] = "join"

    def realtime_problem(self) -> str | None:
        return (
            "a join of two streams is not supported by Spark's Real-Time Mode; "
            "enrich from a file: table joins in real time"
        )

    on: tuple[str, ...] = Field(min_length=1, description="Fields both inputs are matched on.")
    lower: SignedDuration = Field(description="Earliest right time, relative to the left time.")
    upper: SignedDuration = Field(description="Latest right time, relative to the left time.")
    how: Literal["inner", "left"] = "inner"
    suffix: str = Field(
        default="_right",
        pattern=r"^\w+$",
        description="Added to right-side column names the left side already uses.",
    )

    @field_validator("on", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return one_or_many(v)

    @model_validator(mode="before")
    @classmethod
    def _within(cls, data: Any) -> Any:
        """Accept ``within: [-5s, +5s]`` (or one duration ``d`` for ``[-d, +d]``)."""
        if not isinstance(data, dict) or "within" not in data:
            return data
        data = dict(data)
        within = data.pop("within")
        if isinstance(within, list | tuple) and len(within) == 2:
            data["lower"], data["upper"] = within
        elif isinstance(within, str | int | float):
            text = str(within).lstrip("+")
            data["lower"], data["upper"] = f"-{text}", text
        else:
            raise ValueError("within: give [lower, upper], e.g. ['-5s', '+5s'], or one duration")
        return data

    @model_validator(mode="after")
    def _bounds(self) -> JoinStep:
        if self.lower > self.upper:
            raise ValueError(
                f"within: the lower bound ({self.lower:g} s) is after the upper ({self.upper:g} s)"
            )
        return self

    def check_inputs(self, inputs: Sequence[StreamFacts]) -> None:
        for side, source, facts in zip(("left", "right"), self.inputs, inputs, strict=True):
            if facts.event_time is None:
                raise ValueError(
                    f"join {self.id!r}: the {side} input ({source!r}) has no event time; "
                    "an interval join needs event time on both inputs "
                    "(set event_time on the source or add with_event_time(...))"
                )

    def state_key(self, inputs: Sequence[StreamFacts]) -> tuple[str, ...]:
        return self.on

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        left, right = inputs
        return StreamFacts(
            key=left.key, entity=left.entity | right.entity, event_time=left.event_time
        )


class PostgresLookup(BaseModel):
    """Where a ``postgres:`` lookup table is, and how often its mirror is refreshed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dsn: str = Field(description="'postgresql://user@host:port/db'; no password in it.")
    password_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    refresh: Duration = Field(default=60.0, ge=0.5, le=86400, description="Full re-read.")
    notify: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="A LISTEN channel: a NOTIFY on it refreshes the mirror at once.",
    )


def mirror_bucket(table: str) -> str:
    """The key-value bucket a ``postgres:`` table is mirrored into.

    >>> mirror_bucket("public.devices")
    'PG_public_devices'
    """
    return "PG_" + table.replace(".", "_")


class EnrichStep(StepBase):
    """Adds the fields of a table's row to each record whose ``on`` field matches the
    row's key (a stream-table join).

    ``table`` is ``kv:BUCKET`` — a JetStream key-value bucket, keyed by the value of
    ``on`` as text, each entry a JSON object of ``schema``; updated live: an entry put
    (or deleted) applies to the records that arrive after it — or ``file:PATH``, a
    CSV (with a header) or JSON-lines file read when the pipeline starts, keyed by its
    column named like ``on`` — or ``postgres:TABLE``, a PostgreSQL table mirrored into
    the bucket ``PG_<TABLE>`` (every ``refresh``, and at once on a NOTIFY on
    ``notify``) and looked up live as a ``kv:`` table is. ``how: left`` (the default)
    keeps records with no row (its fields null); ``inner`` drops them. A table field
    whose name the record already uses gets ``suffix``.
    """

    type: Literal["enrich"] = "enrich"
    table: str = Field(
        pattern=r"^(kv:[A-Za-z0-9_-]+|file:.+|postgres:([A-Za-z_]\w*\.)?[A-Za-z_]\w*)$",
        description="'kv:BUCKET' (live), 'file:PATH' (.csv with a header, or .json lines) "
        "or 'postgres:TABLE' (mirrored live; needs 'postgres').",
    )
    postgres: PostgresLookup | None = Field(
        default=None, description="Where a postgres: table is and how it is refreshed."
    )
    on: str = Field(description="The record's field matched against the table's key.")
    schema_: Schema = Field(alias="schema", min_length=1, description="The table's fields.")
    how: Literal["left", "inner"] = "left"
    suffix: str = Field(default="_table", pattern=r"^\w+$")
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    local_reason: ClassVar[str] = "looks each record up in the table, where its data is"
    rate: ClassVar[Rate] = Rate.AT_MOST  # how: inner drops records without a row

    def keeps_python_state(self) -> bool:
        return self.path is None  # a live table is kept per key in Python

    def realtime_problem(self) -> str | None:
        if self.path is None:
            return "a live table is looked up in Python; a file: table runs in real time"
        return None

    @model_validator(mode="after")
    def _postgres_given(self) -> EnrichStep:
        if self.table.startswith("postgres:") != (self.postgres is not None):
            raise ValueError("a postgres: table and the 'postgres' settings go together")
        return self

    @property
    def pg_table(self) -> str | None:
        return self.table[len("postgres:") :] if self.table.startswith("postgres:") else None

    @property
    def bucket(self) -> str | None:
        """The live table's bucket (a postgres: table's mirror)."""
        if self.pg_table is not None:
            return mirror_bucket(self.pg_table)
        return self.table[3:] if self.table.startswith("kv:") else None

    @property
    def path(self) -> str | None:
        return self.table[5:] if self.table.startswith("file:") else None
