"""The control log's vocabulary: every decision the coordinator takes is one of these.

A record says *what was decided* with the values it decided (a whole node record, the
assignments made), never "do X next", so applying it (:func:`spanflow.control.state.apply`)
needs no clock, no randomness and no I/O: the leader, a recovering coordinator and a
standby replaying the same records reach the same state.

``epoch`` is the leadership epoch of the coordinator that wrote the record; a record
from an older epoch than the state has seen is refused (a deposed leader's write).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from spanflow.spec.cluster import (
    Assignment,
    Fragment,
    NodeRecord,
    PipelineRecord,
    PipelineState,
    SiteDrain,
)
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.topology import Capabilities, Link, Site


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    at: float = Field(description="Wall-clock time of the decision.")
    epoch: int = Field(default=0, ge=0, description="Leadership epoch of the writer.")


# -- topology and nodes ------------------------------------------------------------------
class TopologyApplied(_Record):
    """A topology file was merged: its sites and links replace those of the same name."""

    kind: Literal["topology"] = "topology"
    name: str
    sites: tuple[Site, ...] = ()
    links: tuple[Link, ...] = ()


class SitePut(_Record):
    """A site was added or changed through the API."""

    kind: Literal["site"] = "site"
    site: Site


class LinkPut(_Record):
    """A link between two sites was added or changed through the API."""

    kind: Literal["link"] = "link"
    link: Link


class NodeDeclared(_Record):
    """A topology file declares (or re-declares) a node; its state is kept."""

    kind: Literal["node-declared"] = "node-declared"
    node: NodeRecord


class NodeRegistered(_Record):
    """An agent started on a node and registered; the node is alive."""

    kind: Literal["node-registered"] = "node-registered"
    node: NodeRecord
    rejoined: bool = False


class _NodeStateChanged(_Record):
    node: str
    reason: str = ""


class NodeFailed(_NodeStateChanged):
    """A node missed heartbeats for ``failure_after`` periods."""

    kind: Literal["node-failed"] = "node-failed"


class NodeRecovered(_NodeStateChanged):
    """A failed node was heard again."""

    kind: Literal["node-recovered"] = "node-recovered"


class NodeDrained(_NodeStateChanged):
    """A node takes no new fragments; its fragments are moved away."""

    kind: Literal["node-drained"] = "node-drained"


class NodeCapabilitiesChanged(_Record):
    kind: Literal["node-capabilities"] = "node-capabilities"
    node: str
    capabilities: Capabilities


class NodeScaled(_Record):
    """A node on a Spark cluster asked for more executors, or gave some back: its
    allocation within its declared bounds (its capabilities, which the planner places
    by, stay what it can grow to)."""

    kind: Literal["node-scaled"] = "node-scaled"
    node: str
    executors_before: int
    executors: int
    cores: int
    memory_mb: int
    pressure: float
    reason: str


class NodeRemoved(_Record):
    kind: Literal["node-removed"] = "node-removed"
    node: str


# -- pipelines ----------------------------------------------------------------------------
class PipelineSubmitted(_Record):
    """A pipeline was accepted (new, or resubmitted after it stopped or ended)."""

    kind: Literal["pipeline-submitted"] = "pipeline-submitted"
    pipeline: PipelineRecord


class PipelineStateChanged(_Record):
    """A pipeline moved along its lifecycle (``spec.cluster.TRANSITIONS``)."""

    kind: Literal["pipeline-state"] = "pipeline-state"
    pipeline: str
    state: PipelineState
    reason: str = ""


class _PipelineEnded(_Record):
    """A pipeline stopped for good, or at a savepoint; its assignments are gone."""

    pipeline: str
    reason: str = ""


class PipelineCanceled(_PipelineEnded):
    kind: Literal["pipeline-canceled"] = "pipeline-canceled"


class PipelineFinished(_PipelineEnded):
    kind: Literal["pipeline-finished"] = "pipeline-finished"


class PipelineFailed(_PipelineEnded):
    kind: Literal["pipeline-failed"] = "pipeline-failed"


class PipelineStopped(_PipelineEnded):
    """Every fragment stopped at the savepoint it was asked for."""

    kind: Literal["pipeline-stopped"] = "pipeline-stopped"


PipelineEnded = PipelineCanceled | PipelineFinished | PipelineFailed | PipelineStopped


class SavepointStarted(_Record):
    """Every fragment of a pipeline is asked to stop at a savepoint under ``savepoint``."""

    kind: Literal["pipeline-savepoint"] = "pipeline-savepoint"
    pipeline: str
    savepoint: str
    fragment_dirs: dict[str, str] = Field(description="fragment id → its savepoint dir")


class PipelineResumed(_Record):
    """A stopped pipeline starts again from a savepoint."""

    kind: Literal["pipeline-resumed"] = "pipeline-resumed"
    pipeline: str
    savepoint: str


class UpgradeRequested(_Record):
    """A new version of a running pipeline, checked against the old one step by step:
    it starts from the savepoint taken with it, once every fragment stopped there."""

    kind: Literal["pipeline-upgrade"] = "pipeline-upgrade"
    pipeline: str
    spec: PipelineSpec
    steps: list[dict[str, str]] = Field(
        default_factory=list, description="Each stateful step's verdict (spec.upgrade)."
    )
    because: str = Field(
        default="", description="Why, when the coordinator upgraded on its own (a site joined)."
    )


class SiteDraining(_Record):
    """A site left a running pipeline: its local fragment had nothing left to read, and
    the pipeline lets it go once the global fragment has read what it sent."""

    kind: Literal["site-draining"] = "site-draining"
    pipeline: str
    drain: SiteDrain


class PipelineUpgraded(_Record):
    """The new version replaced the old one, which stopped at ``savepoint``; it starts
    from there (fragments the old version did not have start empty)."""

    kind: Literal["pipeline-upgraded"] = "pipeline-upgraded"
    pipeline: str
    savepoint: str
    fragments: list[str] = Field(description="The fragments the savepoint holds.")


class DetectorRebaselined(_Record):
    """An operator accepted a key's current behaviour as its new normal: the
    ``detect_anomalies`` step ``step`` forgets what it learnt of ``key`` (``*``: of
    every key) at its next micro-batch and learns that key afresh."""

    kind: Literal["detector-rebaselined"] = "detector-rebaselined"
    pipeline: str
    step: str
    key: str
    generation: int = Field(ge=1, description="Rises with every rebaseline of the step.")
    by: str = Field(default="", description="Who asked (the API's principal), if known.")


class CatalogChanged(_Record):
    """The model registry or the rule sets changed: a version pushed, promoted, rolled
    back, or a publication asked for. Their files and manifests are in their own
    stores (spanflow.ml.model_store, spanflow.cep.rule_store); only the leader writes
    them, and each change is recorded here, in order with every other decision."""

    kind: Literal["catalog-changed"] = "catalog-changed"
    catalog: Literal["model", "rules"]
    name: str
    action: Literal["push", "promote", "rollback", "publish"]
    version: int | None = Field(default=None, description="The version the change made current.")
    stage: str | None = Field(default=None, description="A model's stage (promote).")
    by: str = Field(default="", description="Who asked (the API's principal), if known.")


# -- placement ----------------------------------------------------------------------------
class FragmentsAssigned(_Record):
    """Fragments of one pipeline were placed; each assignment carries a new epoch."""

    kind: Literal["assign"] = "assign"
    pipeline: str
    plan: tuple[Fragment, ...] = Field(description="The pipeline's fragments, as planned.")
    assignments: tuple[Assignment, ...]


class FragmentsUnassigned(_Record):
    """A node's fragments were taken away (it failed, drained or left)."""

    kind: Literal["unassign"] = "unassign"
    node: str
    fragments: tuple[str, ...]
    reason: str = ""


class MoveStarted(_Record):
    """A running fragment is asked to stop at a savepoint, to start on ``to`` from it."""

    kind: Literal["move-start"] = "move-start"
    fragment: str
    node: str = Field(description="Where it runs now.")
    to: str
    savepoint_dir: str
    reason: str = ""


class MoveFinished(_Record):
    """The fragment stopped at its savepoint; it is assigned to its new node."""

    kind: Literal["move-done"] = "move-done"
    fragment: str
    node: str = Field(description="Where it ran.")
    to: str
    fragment_epoch: int = Field(ge=1, description="The fragment's epoch on its new node.")
    checkpoint_dir: str | None = Field(
        default=None,
        description="Its checkpoint on the new node when the target site keeps state "
        "elsewhere (a site's `state:`); None: the same as before.",
    )


class LeaderElected(_Record):
    """A coordinator won the election; records of older epochs are refused from now."""

    kind: Literal["leader"] = "leader"
    leader: str


RECORD_CLASSES: tuple[type[_Record], ...] = (
    TopologyApplied,
    SitePut,
    LinkPut,
    NodeDeclared,
    NodeRegistered,
    NodeFailed,
    NodeRecovered,
    NodeDrained,
    NodeCapabilitiesChanged,
    NodeScaled,
    NodeRemoved,
    PipelineSubmitted,
    PipelineStateChanged,
    PipelineCanceled,
    PipelineFinished,
    PipelineFailed,
    PipelineStopped,
    SavepointStarted,
    PipelineResumed,
    DetectorRebaselined,
    CatalogChanged,
    FragmentsAssigned,
    FragmentsUnassigned,
    MoveStarted,
    MoveFinished,
    LeaderElected,
)

Record = Annotated[
    TopologyApplied
    | SitePut
    | LinkPut
    | NodeDeclared
    | NodeRegistered
    | NodeFailed
    | NodeRecovered
    | NodeDrained
    | NodeCapabilitiesChanged
    | NodeScaled
    | NodeRemoved
    | PipelineSubmitted
    | PipelineStateChanged
    | PipelineCanceled
    | PipelineFinished
    | PipelineFailed
    | PipelineStopped
    | SavepointStarted
    | PipelineResumed
    | UpgradeRequested
    | SiteDraining
    | PipelineUpgraded
    | DetectorRebaselined
    | CatalogChanged
    | FragmentsAssigned
    | FragmentsUnassigned
    | MoveStarted
    | MoveFinished
    | LeaderElected,
    Field(discriminator="kind"),
]
"""Every record kind, as one tagged union (the tag is ``kind``)."""

RECORDS: TypeAdapter[Record] = TypeAdapter(Record)

RECORD_KINDS: tuple[str, ...] = tuple(cls.model_fields["kind"].default for cls in RECORD_CLASSES)


def encode(record: Record) -> bytes:
    return record.model_dump_json().encode()


def decode(data: bytes) -> Record:
    return RECORDS.validate_json(data)


def summary(record: Record) -> dict[str, object]:
    """What the log API shows of a record: its fields, with big values abbreviated."""
    out: dict[str, object] = {}
    for name, value in record:
        if name in ("kind", "at", "epoch"):
            continue
        if isinstance(value, NodeRecord):
            out[name] = value.name
        elif isinstance(value, PipelineRecord):
            out[name] = value.name
            out["run_id"] = value.run_id
        elif name == "assignments":
            out["placement"] = {a.fragment.id: a.node for a in value}
        elif name == "plan":
            continue
        elif isinstance(value, PipelineSpec | Site | Link | Capabilities):
            out[name] = value.model_dump(mode="json", by_alias=True)
        elif isinstance(value, tuple) and value and isinstance(value[0], Site | Link):
            out[name] = [v.model_dump(mode="json", by_alias=True) for v in value]
        else:
            out[name] = value.value if hasattr(value, "value") else value
    return out
