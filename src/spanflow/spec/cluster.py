"""The records a cluster keeps and exchanges: nodes, pipelines, fragments, assignments,
heartbeats and activity reports.

They are plain JSON (pydantic models) because they cross process boundaries: they live
in JetStream KV, travel over NATS and through the REST API, and are appended to the
write-ahead log. Nothing here is ever pickled.
"""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from spanflow.spec.durations import Duration
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.topology import Capabilities, NodeSpec

HISTORY_LIMIT = 50


def now() -> float:
    return time.time()


class NodeState(StrEnum):
    DECLARED = "declared"  # in the topology, no agent has registered yet
    ALIVE = "alive"
    DRAINING = "draining"  # takes no new fragments; its fragments are moved away
    FAILED = "failed"  # missed three heartbeat periods


class NodeRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: NodeSpec
    state: NodeState = NodeState.DECLARED
    agent_id: str | None = Field(default=None, description="Changes whenever the agent restarts.")
    host: str | None = None
    since: float = Field(default_factory=now, description="When the state last changed.")
    gossip: str | None = Field(
        default=None, description="host:port of the agent's membership (SWIM) endpoint."
    )
    executors: int | None = Field(
        default=None,
        description="Executors it holds on its Spark cluster, when it scales with load "
        "(None: it does not).",
    )

    @property
    def name(self) -> str:
        return self.spec.name


class PipelineState(StrEnum):
    CREATED = "created"  # accepted, not placed yet (e.g. waiting for capacity)
    PLANNED = "planned"  # fragments assigned, not all running yet
    RUNNING = "running"
    FAILING = "failing"  # a fragment is failing or lost its node; being repaired
    STOPPING = "stopping"  # taking a savepoint
    STOPPED = "stopped"  # stopped at a savepoint; resume continues from it
    CANCELED = "canceled"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (PipelineState.CANCELED, PipelineState.FINISHED, PipelineState.FAILED)


def _to(*states: str) -> frozenset[PipelineState]:
    return frozenset(PipelineState(s) for s in states)


TRANSITIONS: dict[PipelineState, frozenset[PipelineState]] = {
    PipelineState.CREATED: _to("planned", "canceled", "failed"),
    PipelineState.PLANNED: _to("created", "running", "failing", "canceled", "failed", "stopping"),
    PipelineState.RUNNING: _to("failing", "stopping", "canceled", "finished", "failed", "planned"),
    PipelineState.FAILING: _to("running", "planned", "created", "canceled", "failed", "stopping"),
    PipelineState.STOPPING: _to("stopped", "canceled", "failed", "failing"),
    PipelineState.STOPPED: _to("created", "planned", "canceled"),
    PipelineState.CANCELED: _to(),
    PipelineState.FINISHED: _to(),
    PipelineState.FAILED: _to(),
}
"""The pipeline lifecycle. Anything else is a bug or a request that makes no sense
(cancelling a finished pipeline), answered with a clear error."""


class Transition(BaseModel):
    at: float
    state: PipelineState
    reason: str = ""


class Traffic(BaseModel):
    """What a fragment pulls from one site, estimated from the topology's declared
    stream rates (``nodes[].streams[].rate``): the planner checks it against the link's
    bandwidth when the fragment runs at another site."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bytes_per_s: float = Field(ge=0)
    at_most: bool = Field(
        default=False,
        description="An upper bound: a filter on the way may drop records (the planner "
        "then explains an overfull link instead of refusing it).",
    )
    streams: tuple[str, ...] = Field(default=(), description="The declared streams it comes from.")

    @property
    def mbps(self) -> float:
        return self.bytes_per_s * 8 / 1e6


class Fragment(BaseModel):
    """A piece of a pipeline that runs on one node as Spark queries.

    A *local* fragment runs at one site on that site's data (one replica per site that
    hosts an input stream); a *global* fragment gathers what several sites' local
    fragments send it. A pipeline that needs no split is one fragment, ``<name>.f0``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(
        description="'<pipeline>.f0', '<pipeline>.at-<site>' or '<pipeline>.global': "
        "unique in the cluster, KV-key safe."
    )
    pipeline: str
    spec: PipelineSpec
    input_streams: tuple[str, ...] = ()
    kind: Literal["local", "global"] = "global"
    site: str | None = Field(default=None, description="Local fragments: their site.")
    input_sites: tuple[str, ...] = Field(
        default=(), description="Sites its input comes from (the MinMax inputs)."
    )
    steps: tuple[str, ...] = Field(default=(), description="The pipeline steps it runs.")
    cloud: bool = Field(default=False, description="Pinned to a cloud site.")
    node_tags: tuple[str, ...] = Field(default=(), description="Tags its node must have.")
    node_accelerators: tuple[str, ...] = Field(
        default=(), description="Accelerators its node must have."
    )
    node_cores: int = Field(default=0, ge=0, description="Cores its node must offer (0: any).")
    node_memory_mb: int = Field(
        default=0, ge=0, description="Memory (MiB) its node must offer (0: any)."
    )
    traffic: dict[str, Traffic] = Field(
        default_factory=dict,
        description="Input site → what it pulls from there, where the topology's declared "
        "stream rates tell (the planner checks it against the links' bandwidth).",
    )
    reach_sites: tuple[str, ...] | None = Field(
        default=None,
        description="Sites from which every external system it reads or writes is "
        "reachable (None: it uses none the topology declares).",
    )
    plan: PipelineSpec | None = Field(
        default=None,
        description="The planned pipeline it was cut from, where sources read another "
        "fragment's output (their schema is taken from it).",
    )

    replica: int = Field(
        default=0,
        ge=0,
        description="0: the fragment as planned; n ≥ 1: its n-th hot standby replica "
        "(id '<fragment id>.r<n>'), which runs the same spec on another node.",
    )

    @staticmethod
    def make_id(pipeline: str, index: int) -> str:
        return f"{pipeline}.f{index}"

    @property
    def base_id(self) -> str:
        """The planned fragment's id, shared by all its replicas."""
        return self.id.removesuffix(f".r{self.replica}") if self.replica else self.id

    def as_replica(self, n: int) -> Fragment:
        """Its ``n``-th hot standby replica (``n`` = 0: the fragment itself)."""
        if n == self.replica:
            return self
        return self.model_copy(
            update={"id": f"{self.base_id}.r{n}" if n else self.base_id, "replica": n}
        )

    def slots_on(self, caps: Capabilities) -> int:
        """Fragment slots it takes on a node with ``caps``: one, plus one per Python
        stateful step, never more than the node has (planner, agents and metrics)."""
        return caps.slots_for(self.spec.fragment_slots())


class SiteDrain(BaseModel):
    """A site that left a running pipeline, marked once its local fragment had nothing
    left to read: the global fragment has read all the site sent once it has run two
    more batches than ``global_batches`` with nothing behind (and the site's fragment
    read nothing since)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    site: str
    global_batches: dict[str, int] = Field(
        description="Global fragment id → its batches when the site was marked."
    )
    site_rows_in: int = Field(
        ge=0, description="Records the site's local fragment had read when marked."
    )
    since: float


class PipelineRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: PipelineSpec
    priority: int = Field(default=0, ge=0, le=1000, description="Higher is placed first.")
    latency_budget: Duration | None = Field(default=None, gt=0, description="End to end.")
    parallelism: int = Field(default=1, ge=1, le=256)
    state: PipelineState = PipelineState.CREATED
    reason: str = ""
    submitted_at: float = Field(default_factory=now)
    history: list[Transition] = Field(default_factory=list)
    savepoint: str | None = Field(default=None, description="Last savepoint directory.")
    run_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex[:8],
        description="New on every submission: its checkpoints are its own.",
    )
    epochs: dict[str, int] = Field(default_factory=dict, description="fragment id → epoch")
    restore_from: str | None = Field(default=None, description="Savepoint to start from.")
    restore_fragments: list[str] | None = Field(
        default=None,
        description="The fragments restore_from holds (None: all); the others start empty.",
    )
    upgrade: PipelineSpec | None = Field(
        default=None, description="A new version waiting for its savepoint to complete."
    )
    fragments: list[Fragment] = Field(
        default_factory=list, description="The current plan's fragments (empty until planned)."
    )
    named_sources: bool = Field(
        default=False,
        description="Its queries keep their offsets by source name (placed by a release "
        "that names sources): a site that joins is taken into its running plan.",
    )
    draining: dict[str, SiteDrain] = Field(
        default_factory=dict,
        description="Sites that left, whose last readings the global fragment is still "
        "reading before the pipeline lets them go (spanflow.control.drains).",
    )
    rebaselines: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="detect_anomalies step id → key (or '*': every key) → the generation "
        "of its last rebaseline (spanflow.ml.rebaseline).",
    )

    @property
    def name(self) -> str:
        return self.spec.name

    def rebaselined(self, step: str, key: str, generation: int) -> PipelineRecord:
        """This record with ``key`` of ``step`` rebaselined at ``generation``."""
        steps = dict(self.rebaselines)
        steps[step] = {**steps.get(step, {}), key: generation}
        return self.model_copy(update={"rebaselines": steps})

    def moved_to(
        self, state: PipelineState, reason: str = "", at: float | None = None
    ) -> PipelineRecord:
        stamp = now() if at is None else at
        history = [*self.history, Transition(at=stamp, state=state, reason=reason)]
        return self.model_copy(
            update={"state": state, "reason": reason, "history": history[-HISTORY_LIMIT:]}
        )


class Assignment(BaseModel):
    """A fragment placed on a node. Stored in KV under ``<node>.<fragment id>``; the
    node's agent watches its keys, so it learns of assignments without the coordinator
    being up."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fragment: Fragment
    node: str
    epoch: int = Field(ge=1, description="Grows on every (re)assignment of the fragment.")
    checkpoint_dir: str
    action: Literal["run", "savepoint"] = "run"
    savepoint_dir: str | None = None
    restore_from: str | None = Field(default=None, description="Savepoint to start from.")
    move_to: str | None = Field(
        default=None,
        description="A planned move: the fragment stops at a committed batch here "
        "(action savepoint), then starts on this node from that savepoint.",
    )
    reason: str = ""
    batch_plan: str | None = Field(
        default=None,
        description="Hot standby: the name under which every replica of the fragment "
        "agrees its micro-batches (spanflow.nats.batch_plan), so they write the same "
        "output; None without standby.",
    )
    peer_checkpoints: tuple[str, ...] = Field(
        default=(),
        description="Hot standby: the checkpoints of the fragment's other replicas. A "
        "replica whose own checkpoint lags starts from a copy of a peer's "
        "(spanflow.spark.checkpoints.peer_checkpoint).",
    )
    priority: int = Field(default=0, description="Its pipeline's priority (higher first).")
    latency_budget: float | None = Field(
        default=None, description="Its pipeline's latency budget in seconds, if any."
    )

    @property
    def key(self) -> str:
        return f"{self.node}.{self.fragment.id}"
