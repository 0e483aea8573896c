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
from typing import Any, Literal

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

    @staticmethod
    def make_id(pipeline: str, index: int) -> str:
        return f"{pipeline}.f{index}"

    def slots_on(self, caps: Capabilities) -> int:
        """Fragment slots it takes on a node with ``caps``: one, plus one per Python
        stateful step, never more than the node has (planner, agents and metrics)."""
        return caps.slots_for(self.spec.fragment_slots())


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
    fragments: list[Fragment] = Field(
        default_factory=list, description="The current plan's fragments (empty until planned)."
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
    priority: int = Field(default=0, description="Its pipeline's priority (higher first).")
    latency_budget: float | None = Field(
        default=None, description="Its pipeline's latency budget in seconds, if any."
    )

    @property
    def key(self) -> str:
        return f"{self.node}.{self.fragment.id}"


LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Upper bounds (seconds) of every latency and duration histogram spanflow reports."""


class Histogram(BaseModel):
    """Observations counted into :data:`LATENCY_BUCKETS` (the last count: above them),
    with their sum: a Prometheus histogram before it is made cumulative."""

    counts: list[int] = Field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    sum: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, seconds: float, times: int = 1) -> None:
        i = next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS))
        self.counts[i] += times
        self.sum += seconds * times

    def merge(self, counts: list[int], total: float) -> None:
        """Add observations already counted per bucket (``counts``, as :attr:`counts`)
        whose sum is ``total``: a whole batch's at once."""
        for i, n in enumerate(counts):
            self.counts[i] += n
        self.sum += total

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations ≤ le) per bucket, ``+Inf`` last."""
        out, total = [], 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class QueryMetrics(BaseModel):
    """One sink's query of a fragment, since it started on this node (counters restart
    with the fragment: Prometheus's ``rate`` and ``increase`` take that in their stride)."""

    realtime: bool = False
    records_in: int = Field(default=0, description="Records its batches read.")
    records_out: int | None = Field(
        default=None,
        description="Records it wrote (JetStream sinks on micro-batches; None: not counted).",
    )
    batches: int = 0
    batch_seconds: Histogram = Field(
        default_factory=Histogram, description="Micro-batch durations (processing latency)."
    )
    latency_seconds: Histogram = Field(
        default_factory=Histogram,
        description="End to end: publish time of each output record minus that of its "
        "input record (records that keep their source's _published only: not aggregates).",
    )
    checkpoint_seconds: Histogram = Field(
        default_factory=Histogram,
        description="Per batch: offset log write, commit log write and state store commits.",
    )
    state_rows: int = Field(default=0, description="Rows in its state stores (last batch).")
    state_bytes: int = Field(default=0, description="Memory its state stores use (last batch).")
    trigger_seconds: float = Field(default=0.0, description="Its micro-batch interval.")
    last_batch_seconds: float = 0.0


class FragmentRuntime(BaseModel):
    """What a node reports about one of its fragments."""

    fragment_id: str
    epoch: int
    status: Literal["starting", "running", "failing", "stopped", "failed", "finished", "fenced"]
    started_at: float | None = None
    queries: dict[str, str] = Field(default_factory=dict, description="sink → Spark run id")
    batches: int = 0
    rows_in: int = 0
    input_rows_per_s: float = 0.0
    processed_rows_per_s: float = 0.0
    realtime_rows_per_s: float = Field(
        default=0.0,
        description="rows/s its real-time queries read, live (their batches last minutes; "
        "input and processed rates are the micro-batch queries')",
    )
    last_batch_ms: int = 0
    lag: int = 0
    watermark: str | None = None
    restarts: int = 0
    dead_letters: int = 0
    offsets: dict[str, Any] = Field(default_factory=dict, description="sink → committed offsets")
    error: str | None = None
    metrics: dict[str, QueryMetrics] = Field(
        default_factory=dict, description="sink → its query's counters and histograms"
    )


class StreamUsage(BaseModel):
    """How full a stream a node uses is, against its limits (spanflow.spec.retention).

    >>> u = StreamUsage(stream="SENSORS", messages=9, bytes=900, max_bytes=1000)
    >>> u.warning
    'stream SENSORS is 90 % full (900 B of 1000 B); when full it refuses new messages'
    """

    stream: str
    messages: int = 0
    bytes: int = 0
    max_bytes: int | None = None
    """None: no limit."""
    max_age: float | None = None
    discard: Literal["new", "old"] = "new"
    warn_at: float = 0.8

    @property
    def ratio(self) -> float | None:
        return self.bytes / self.max_bytes if self.max_bytes else None

    @property
    def warning(self) -> str | None:
        """What to tell an operator when the stream is near its limit (None: fine)."""
        ratio = self.ratio
        if ratio is None or ratio < self.warn_at:
            return None
        when_full = "refuses new messages" if self.discard == "new" else "drops the oldest"
        return (
            f"stream {self.stream} is {ratio:.0%} full ({_size(self.bytes)} of "
            f"{_size(self.max_bytes or 0)}); when full it {when_full}"
        ).replace("%", " %")


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


class ShedRequest(BaseModel):
    """An overloaded node asks for one of its fragments to move to a peer
    (``POST /api/v1/nodes/{name}/shed``; see docs/balancing.md)."""

    model_config = ConfigDict(extra="forbid")

    fragment: str
    to: str = Field(description="The peer that should take it.")
    load: float | None = Field(default=None, description="The asking node's load score.")
    peer_load: float | None = Field(default=None, description="The peer's, as gossiped.")
    reason: str = Field(default="", max_length=500)


class PeerView(BaseModel):
    """How a node's membership (gossip) sees one peer of its partition."""

    state: Literal["alive", "suspect", "dead", "left"]
    incarnation: int = 0
    since_s: float = Field(default=0.0, description="Seconds in this state when reported.")
    heard_s: float | None = Field(
        default=None, description="Seconds since the peer last answered or probed directly."
    )
    load: float | None = Field(default=None, description="The peer's load score, as gossiped.")
    free_slots: int | None = None
    load_age_s: float | None = None
    connected: bool | None = Field(
        default=None, description="Whether the peer says its NATS connection is up."
    )


class Heartbeat(BaseModel):
    node: str
    agent_id: str
    seq: int
    at: float = Field(default_factory=now)
    cpu_percent: float = 0.0
    memory_percent: float = 0.0
    slots: int = 0
    fragments: dict[str, FragmentRuntime] = Field(default_factory=dict)
    streams: list[StreamUsage] = Field(
        default_factory=list, description="Usage of the streams this node hosts and writes."
    )
    last_known: bool = Field(
        default=False,
        description="Running its last-known assignments: the control plane's are out of reach.",
    )
    ready: bool = Field(
        default=True,
        description="Its Spark session is up: fragments assigned to it start at once.",
    )
    load: float | None = Field(
        default=None, description="Load score: 0 idle, 1 at capacity, above 1 falling behind."
    )
    bottleneck: str | None = Field(default=None, description="What the load score comes from.")
    gossip: str | None = Field(default=None, description="host:port of its membership endpoint.")
    peers: dict[str, PeerView] = Field(
        default_factory=dict, description="Its membership's view of its partition's other nodes."
    )
    gossip_rejected: int = Field(
        default=0,
        description="Gossip packets its keyring did not open (forged, another cluster's, a "
        "key not yet installed) since the agent started.",
    )


ActivityEvent = Literal[
    "started",
    "progress",
    "stopped",
    "failed",
    "finished",
    "savepointed",
    "shed-requested",
    "shed-refused",
]


class Activity(BaseModel):
    """A node's report of what happened to a fragment: appended to the activity log."""

    node: str
    agent_id: str
    event: ActivityEvent
    at: float = Field(default_factory=now)
    runtime: FragmentRuntime
    savepoint_dir: str | None = None
    detail: str | None = Field(default=None, description="What happened, in words (shedding).")
