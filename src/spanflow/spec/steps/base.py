"""What every step type is: a frozen pydantic model that declares its own traits.

A step type is one class in one module of :mod:`spanflow.spec.steps`. Besides its
fields, the class says — in one place — what the planner and the front ends need to
know about it, so that neither has to switch on step types:

* ``arity``: how many inputs it takes;
* ``placement``: record by record (it runs wherever its input is) or keyed state
  (local when its key is born at one site, global otherwise);
* :meth:`StepBase.facts`: how it changes what is known about the stream (key, the
  fields that say where a record is born, event time);
* :meth:`StepBase.state_key`: what its state is partitioned by;
* :meth:`StepBase.split`: how it splits into a per-site partial and a global merge,
  where it can;
* :meth:`StepBase.expand`: the core steps a convenience step stands for (the classic
  ``forward``/``sum``/``count``/``average`` processors are such sugar);
* :meth:`StepBase.realtime_problem`: why it cannot run in Spark's Real-Time Mode, if it
  cannot (only SQL steps can: see docs/realtime.md).

How a step runs on Spark is registered apart, in :mod:`spanflow.spark.compile`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from spanflow.spec.topology import memory_mb

STEP_ID = r"^[A-Za-z_][A-Za-z0-9_-]*$"
FUNCTION_REF = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.<>]*$"

FunctionRef = Annotated[
    str,
    Field(
        pattern=FUNCTION_REF,
        description="A Python function or class as 'module:qualname', imported where the "
        "pipeline runs.",
    ),
]


class Placement(StrEnum):
    """How a step's work may be divided between sites."""

    RECORD = "record"
    """Record by record (or a union of streams): runs wherever its input is."""
    KEYED = "keyed"
    """Keeps state per key: runs at each site when its key is born at one site, else
    where every site's data meets (or split into partial + merge, see ``split``)."""


class Rate(StrEnum):
    """What a step does to the number of records per second it is given: how the planner
    carries a stream's declared rate to what a fragment ships across a site link."""

    KEEPS = "keeps"
    """One record out per record in (select, map, key_by, event time, score, enrich)."""
    AT_MOST = "at_most"
    """At most one record out per record in (filter): the rate is an upper bound."""
    SUMS = "sums"
    """Its inputs' rates added (union)."""
    UNKNOWN = "unknown"
    """Anything else (windows, keyed state, patterns): not estimated."""


@dataclass(frozen=True)
class StreamFacts:
    """What is known about the records a step emits.

    ``entity`` holds the fields that identify where a record is born (a device is
    born at one site): state keyed by one of them can stay at each site.
    ``event_time`` is (field, allowed lateness in seconds), or None when the records
    carry no event time the next site could watermark.
    """

    key: tuple[str, ...] = ()
    entity: frozenset[str] = frozenset()
    event_time: tuple[str, float] | None = None


@dataclass(frozen=True)
class Split:
    """A step divided for several sites: ``partial`` runs at each site on its own
    data, ``merge`` folds the partials where they meet and stands for the step."""

    partial: StepBase
    merge: StepBase


_REGISTRY: dict[str, type[StepBase]] = {}

NO_NODE_PINS: dict[str, Any] = {
    "node_tags": (),
    "node_accelerators": (),
    "node_cores": None,
    "node_memory_mb": None,
}
"""The node pins of a step that may run on any node."""


class StepBase(BaseModel):
    """Fields and traits common to every step type."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arity: ClassVar[tuple[int, int | None]] = (1, 1)
    """(fewest, most) inputs; None = no upper bound."""
    placement: ClassVar[Placement] = Placement.RECORD
    local_reason: ClassVar[str] = "record by record, where its data is"
    """Why a RECORD step runs where it does (the planner adds the sites)."""
    rate: ClassVar[Rate] = Rate.UNKNOWN
    """How it changes its input's records per second (link bandwidth estimates)."""
    upgrade_free: ClassVar[frozenset[str]] = frozenset()
    """Fields of a stateful step a new version may change while the step keeps its
    state: they decide what the step does with its state, not what the state holds
    (a detector's threshold). Every other field shapes the state
    (:mod:`spanflow.spec.upgrade`)."""

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
    node_accelerators: tuple[str, ...] = Field(
        default=(),
        description="Pin: the step runs on a node with all of these accelerators (e.g. gpu).",
    )
    node_cores: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Pin: the step runs on a node that offers at least this many cores "
        "(its capabilities.cores).",
    )
    node_memory_mb: int | None = Field(
        default=None,
        ge=1,
        description="Pin: the step runs on a node that offers at least this much memory "
        "(its capabilities.memory_mb); '8g' and '512m' accepted.",
    )

    @field_validator("node_memory_mb", mode="before")
    @classmethod
    def _memory_size(cls, value: Any) -> Any:
        return memory_mb(value)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        type_field = cls.model_fields.get("type")
        if type_field is None or not isinstance(type_field.default, str):
            return  # an abstract base, not a step type
        name = type_field.default
        known = _REGISTRY.get(name)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"step type {name!r} is declared twice: {known} and {cls}")
        _REGISTRY[name] = cls

    def pins(self) -> dict[str, Any]:
        """The placement pins, for a step that expands into others which keep them."""
        return {
            "at": self.at,
            "node_tags": self.node_tags,
            "node_accelerators": self.node_accelerators,
            "node_cores": self.node_cores,
            "node_memory_mb": self.node_memory_mb,
        }

    def node_pins(self) -> dict[str, Any]:
        """The pins on the node a step runs on (tags, accelerators, cores, memory)."""
        return {k: v for k, v in self.pins().items() if k != "at"}

    @property
    def type_name(self) -> str:
        return str(getattr(self, "type"))  # noqa: B009 - every concrete step has 'type'

    # -- traits ------------------------------------------------------------------------
    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        """What is known about this step's output, given its inputs'. Default: the first
        input's facts, unchanged."""
        return inputs[0]

    def check_inputs(self, inputs: Sequence[StreamFacts]) -> None:
        """Raise ValueError when the inputs cannot feed this step (e.g. a count window
        on a stream with no key). Called when a pipeline is validated."""

    def state_key(self, inputs: Sequence[StreamFacts]) -> tuple[str, ...]:
        """The fields a KEYED step's state is partitioned by (default: the stream's key)."""
        return inputs[0].key

    def split(self, inputs: Sequence[StreamFacts]) -> Split | None:
        """A per-site partial and a global merge standing for this step, if it has one."""
        return None

    def expand(self) -> tuple[StepBase, ...]:
        """The core steps this step stands for; itself for a core step.

        The last step returned keeps this step's id (so downstream steps still read
        it); the first reads this step's inputs."""
        return (self,)

    def realtime_problem(self) -> str | None:
        """Why this step cannot run in Real-Time Mode (None: it can). Real-Time Mode runs
        JVM operators only, in update mode: Python code (functions, keyed processors,
        patterns, models) stays on micro-batches."""
        return f"a {self.type_name} step runs Python code, which stays on micro-batches"

    def keeps_python_state(self) -> bool:
        """Whether this step keeps per-key state in Spark's Python workers (a keyed
        processor under the hood). Such a step costs a node about a second core's worth
        of work beside the JVM's, so the planner counts it as one more fragment slot."""
        return False

    def state_shape(self) -> dict[str, Any]:
        """What decides the state this step keeps, compared field by field when a new
        version of its pipeline starts from the old one's checkpoint: every field but
        its id, inputs, placement pins and :attr:`upgrade_free`."""
        skip = {"id", "inputs", *self.pins(), *self.upgrade_free}
        return self.model_dump(mode="json", by_alias=True, exclude=skip)

    def state_lateness(self) -> float:
        """Seconds this step waits for late records beyond the stream's own
        ``max_out_of_orderness`` (a window's ``allowed_lateness``): added to the delay
        of the watermark its stream declares."""
        return 0.0

    def state_horizon(self) -> float:
        """Seconds of event time this step remembers records for; the watermark delay of
        the stream covers it (e.g. a de-duplication within 10 minutes)."""
        return 0.0


def step_types() -> dict[str, type[StepBase]]:
    """Every registered step type by its ``type`` name (import the family modules first:
    :mod:`spanflow.spec.steps` does)."""
    return dict(_REGISTRY)


def derived_id(base: str, suffix: str) -> str:
    """``<base>__<suffix>``, shortened with a hash when it would pass 64 characters.

    >>> derived_id("per_device", "partial")
    'per_device__partial'
    """
    text = f"{base}__{suffix}"
    if len(text) <= 64:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{text[:55]}_{digest}"


def one_or_many(value: Any) -> Any:
    """Field validator helper: ``"device"`` → ``("device",)``."""
    return (value,) if isinstance(value, str) else value
