"""What the coordinators' REST API answers: one pydantic model per response body.

The routes declare these as their return types, so ``/openapi.json`` documents real
types; :class:`spanflow.protocol.client.CoordinatorClient` parses answers into them;
the dashboard reads the same JSON. A field added here shows up everywhere at once.
Request bodies live beside them (``SubmitBody``, ``ResumeBody``). The model registry's
and rule sets' manifests are their own packages' models (``spanflow.ml.registry``,
``spanflow.cep.rules``), which the routes return as they are.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spanflow.protocol.messages import PeerView
from spanflow.protocol.metrics import FragmentRuntime, StreamUsage
from spanflow.spec.cluster import NodeRecord, NodeSpec, NodeState, PipelineState, Transition
from spanflow.spec.durations import Duration
from spanflow.spec.retention import Retention
from spanflow.spec.topology import Capabilities, HostedStream

__all__ = [
    "ClusterInfo",
    "ClusterMetrics",
    "Connection",
    "FragmentStatus",
    "Health",
    "LogEntry",
    "NodeStatus",
    "PipelineMetrics",
    "PipelineStatus",
    "PublicationRequested",
    "Registered",
    "Registration",
    "ResumeBody",
    "ShedAnswer",
    "SubmitBody",
]


class _Answer(BaseModel):
    """Answers tolerate fields they do not know: a newer coordinator may add some."""

    model_config = ConfigDict(extra="ignore")


# -- cluster --------------------------------------------------------------------------
class Health(_Answer):
    ok: bool
    nodes: int = Field(description="Nodes registered.")
    name: str = Field(description="This coordinator replica.")
    role: Literal["leader", "standby"]
    leader: str | None = Field(description="The replica that leads, as the log says.")


class ClusterInfo(_Answer):
    name: str
    role: Literal["leader", "standby"]
    nats_url: str
    hub_domain: str | None
    heartbeat_interval: float
    failure_after: float
    state_dir: str
    recovered_log_records: int = Field(description="Control-log records replayed at start.")
    log_sequence: int = Field(description="The last control-log record applied.")
    leader: str | None
    leader_epoch: int
    leader_url: str | None
    lease_seconds: float = Field(description="How long the leader's lease lasts.")
    token_required: bool = Field(description="Whether writes need the bearer token.")


class ClusterMetrics(_Answer):
    nodes: dict[str, int] = Field(description="Node count per state.")
    cores: int = Field(description="Cores of live nodes.")
    slots: int = Field(description="Fragment slots of live nodes.")
    slots_used: int = Field(
        description="Slots the assigned fragments take (one more per Python stateful step)."
    )
    utilisation: float = Field(description="slots_used / slots.")
    cpu_percent: float = Field(description="Mean CPU use of live nodes.")
    throughput_rows_per_s: float = Field(description="Input rows per second, all fragments.")
    pipelines: dict[str, int] = Field(description="Pipeline count per state.")
    uptime_s: float = Field(description="Seconds this replica has run.")
    leader: str | None
    leader_epoch: int


class LogEntry(_Answer):
    """One control-log record: a decision (placement, move, shed, election, ...)."""

    seq: int
    kind: str
    at: float = Field(description="Unix time the decision was taken.")
    epoch: int = Field(description="The leader epoch that wrote it.")
    detail: dict[str, Any] = Field(description="Its fields, big values abbreviated.")


# -- nodes ----------------------------------------------------------------------------
class Registration(BaseModel):
    """What a node agent sends when it starts."""

    name: str
    site: str
    agent_id: str
    host: str | None = None
    gossip: str | None = Field(
        default=None, description="host:port where the agent's membership endpoint listens."
    )
    capabilities: Capabilities | None = Field(
        default=None, description="Given on the agent's command line; wins over the topology."
    )
    detected: Capabilities | None = Field(
        default=None, description="What the agent measured; used when nothing else is known."
    )
    streams: tuple[HostedStream, ...] | None = None


class Connection(_Answer):
    """Where a node's data and control traffic go (part of its registration answer)."""

    nats_url: str
    control_domain: str | None = None
    site_domain: str | None = None
    retention: Retention | None = None
    partition: str = ""
    gossip_peers: list[str] = Field(default_factory=list)


class Registered(Connection):
    """The answer to a registration: the node as recorded and how to connect."""

    node: NodeRecord
    heartbeat_interval: float
    gossip_profile: str | None = None


class ShedAnswer(_Answer):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    fragment: str
    from_: str = Field(alias="from", description="The node that shed it.")
    to: str | None = Field(description="The node it moves to.")
    epoch: int


NodeHealth = Literal["declared", "alive", "suspect", "dead", "draining", "last-known", "fenced"]


class NodeStatus(_Answer):
    """A node as recorded plus what its agent last reported."""

    name: str
    spec: NodeSpec
    state: NodeState
    health: NodeHealth = Field(
        description="What to show: dead (failed), suspect (alive but silent for over two "
        "heartbeat periods), last-known (its agent cannot reach a coordinator and runs "
        "what it last knew), fenced (a fragment of it was fenced), else its state."
    )
    agent_id: str | None
    host: str | None
    since: float = Field(description="Unix time its state last changed.")
    fragments: list[str] = Field(description="Fragments assigned to it.")
    running: list[str] = Field(description="Fragments its agent reports running.")
    agent_fragments: dict[str, FragmentRuntime] = Field(
        description="What its agent reports of each fragment."
    )
    slots: int
    slots_used: int = Field(
        default=0, description="Slots its fragments take (one more per Python stateful step)."
    )
    cpu_percent: float | None
    memory_percent: float | None
    last_heartbeat_s: float | None = Field(description="Seconds since it was last heard.")
    streams: list[StreamUsage]
    warnings: list[str]
    last_known_assignments: bool = Field(
        description="Its agent runs what it last knew (it cannot reach a coordinator)."
    )
    ready: bool = Field(description="Its Spark session is up.")
    load: float | None = Field(description="Its load score (0 idle, 1 full).")
    bottleneck: str | None
    gossip_addr: str | None = Field(description="host:port of its membership endpoint.")
    gossip_rejected: int
    gossip: dict[str, PeerView] = Field(description="Its membership view of its peers.")
    executors: int | None = Field(
        default=None,
        description="Executors it holds on its Spark cluster when it scales with load "
        "(None: it does not).",
    )


# -- pipelines ------------------------------------------------------------------------
Priority = Annotated[int, Field(ge=0, le=1000)]
"""A pipeline's priority, 0 (the default) to 1000."""
LatencyBudget = Annotated[Duration | None, Field(gt=0)]
Parallelism = Annotated[int, Field(ge=1, le=256)]
"""Partitions of a pipeline's sources (1 to 256)."""


class SubmitBody(BaseModel):
    """A pipeline as YAML text (a pipeline file) or as a spec object (JSON)."""

    yaml: str | None = Field(default=None, description="The text of a pipeline file.")
    spec: dict[str, Any] | None = Field(default=None, description="A pipeline spec as JSON.")
    filename: str = Field(default="pipeline.yaml", description="Named in error messages.")
    priority: Priority = 0
    latency_budget: LatencyBudget = None
    parallelism: Parallelism = 1


class ResumeBody(BaseModel):
    savepoint: str | None = None


class RebaselineBody(BaseModel):
    """Which key of which detector accepts its current behaviour as normal."""

    model_config = ConfigDict(extra="forbid")

    step: str | None = Field(
        default=None, description="The detect_anomalies step (default: the pipeline's only one)."
    )
    key: str | None = Field(
        default=None,
        description="The key as text (a compound key's values joined by commas); '*': every key.",
    )
    record: dict[str, Any] | None = Field(
        default=None, description="Or a detection as a sink wrote it: its key fields name the key."
    )


class FitBody(BaseModel):
    """A fit of a multivariate detector's normal per key on the stored history."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    start: datetime | None = Field(
        default=None, alias="from", description="Readings from this event time (ISO 8601)."
    )
    end: datetime | None = Field(
        default=None, alias="to", description="... up to this one, excluded (default: all)."
    )
    model: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="Registry model (default: the step's model, or <pipeline>-<step>).",
    )
    promote: bool = Field(default=False, description="Promote the new version to production.")


class FitJob(_Answer):
    """A fit started through the REST API, and how it went."""

    pipeline: str
    step: str
    model: str
    state: Literal["running", "done", "failed"]
    started: float
    finished: float | None = None
    version: int | None = Field(default=None, description="The version it pushed.")
    promoted: bool = False
    output: str = Field(default="", description="The end of the job's output.")


class StepUpgradeVerdict(_Answer):
    """What an upgrade does to one stateful step of one sink's query."""

    sink: str
    step: str
    verdict: Literal["kept", "changed", "added", "dropped", "refused"]
    detail: str = ""


class Rebaselined(_Answer):
    pipeline: str
    step: str
    key: str
    generation: int = Field(description="Rises with every rebaseline of the step.")


class FragmentStatus(_Answer):
    id: str
    replica: int = Field(
        default=0, description="0, or n for the n-th hot standby replica of its fragment."
    )
    kind: Literal["local", "global"]
    site: str | None
    input_sites: list[str]
    steps: list[str]
    node: str | None = Field(description="Where it is assigned (None: unplaced).")
    epoch: int
    action: Literal["run", "savepoint"] | None
    status: str = Field(
        description="As its agent reports, or starting / unassigned, or unreachable when "
        "its node is suspect or dead (its runtime is then the last report, stale)."
    )
    stale_s: float | None = Field(
        default=None, description="Unreachable: seconds since its node was last heard."
    )
    input_latency_s: float = Field(description="Worst one-way latency from its input sites.")
    runtime: FragmentRuntime | None


PipelineHealth = Literal["healthy", "degraded", "inactive"]


class FragmentPlan(_Answer):
    """One fragment as the planner cut it (``GET /api/v1/pipelines/{name}/plan``)."""

    id: str
    kind: Literal["local", "global"]
    site: str | None
    node: str | None = Field(description="Where it is assigned (None: unplaced).")
    steps: list[dict[str, Any]] = Field(
        description="Its own steps as specs (type, inputs, settings) — those the planner "
        "added included: a site's partial aggregate, the read of another fragment's output "
        "(``schema_of`` naming the step it reads) — secrets masked."
    )


class SitesBehind(_Answer):
    """Sites a placed pipeline's plan is behind on (it is planned when first placed)."""

    joined: list[str] = Field(
        description="Sites today's topology gives the pipeline input at that its plan has "
        "no fragment for: their readings are not read until it is planned again (the "
        "coordinator does so on its own for a pipeline whose sources are named; else a "
        "resubmission)."
    )
    left: list[str] = Field(
        description="Sites its plan reads at that today's topology no longer gives it."
    )
    draining: list[str] = Field(
        default_factory=list,
        description="Of ``left``, the sites whose last readings the global fragment is "
        "still reading: the pipeline lets them go once it has.",
    )


class PipelineStatus(_Answer):
    name: str
    state: PipelineState
    health: PipelineHealth = Field(
        description="healthy: running, every fragment runs; degraded: running (or being "
        "repaired) with a fragment that does not run or cannot be reached; else inactive."
    )
    reason: str
    rows_in: int = Field(
        description="Records read from the pipeline's sources, each once, by the fragments "
        "that can be reached now."
    )
    input_rows_per_s: float = Field(description="Their rate.")
    latency_estimate_s: float | None
    over_latency_budget: bool | None
    priority: int
    latency_budget: float | None
    parallelism: int
    run_id: str
    submitted_at: float
    savepoint: str | None
    sites_behind: SitesBehind | None = Field(
        default=None,
        description="Sites declared or removed since the pipeline was placed, that its "
        "plan does not follow yet; None: the plan covers today's topology.",
    )
    fragments: list[FragmentStatus]
    history: list[Transition]


class PipelineMetrics(_Answer):
    name: str
    state: PipelineState
    batches: int
    rows_in: int
    input_rows_per_s: float
    processed_rows_per_s: float
    realtime_rows_per_s: float
    lag: int
    dead_letters: int
    restarts: int
    last_batch_ms: int
    fragments: dict[str, FragmentRuntime]


# -- models ---------------------------------------------------------------------------
class PublicationRequested(_Answer):
    name: str
    request: int = Field(description="The request's number; learn steps answer it.")


# -- live view (dashboard) -------------------------------------------------------------
class FragmentSample(_Answer):
    """One fragment's figures at one instant (the dashboard's charts)."""

    at: float = Field(description="Unix time of the sample.")
    input_rows_per_s: float
    processed_rows_per_s: float
    last_batch_ms: int
    lag: int
    dead_letters: int
    late_records: int = 0
    rows_in: int
    restarts: int
    latency_p50_s: float | None = Field(
        default=None, description="End-to-end latency, median of the records since the last sample."
    )
    latency_p99_s: float | None = Field(default=None, description="Its 99th percentile.")
    state_rows: int = Field(default=0, description="Rows in its state stores.")
    state_bytes: int = Field(default=0, description="Memory its state stores use.")


class PipelineHistory(_Answer):
    """Recent samples of each fragment of a pipeline, oldest first."""

    name: str
    interval_s: float = Field(description="Seconds between samples.")
    fragments: dict[str, list[FragmentSample]]


class Concern(_Answer):
    """One thing an operator should look at (the dashboard's health strip)."""

    level: Literal["red", "amber"]
    what: str = Field(description="node, pipeline, query or stream it is about")
    reason: str


class Snapshot(_Answer):
    """What the dashboard's live stream pushes every interval."""

    at: float
    cluster: ClusterMetrics
    nodes: list[NodeStatus]
    pipelines: list[PipelineStatus]
    samples: dict[str, FragmentSample] = Field(description="The newest sample per fragment.")
    concerns: list[Concern] = Field(
        default_factory=list, description="What is not well, worst first (empty: all green)."
    )


class DataEvent(_Answer):
    """A record a pipeline wrote to a sink shown in the event feed: an anomaly, a
    pattern match or an alert (see the sink's ``feed``)."""

    seq: int = Field(description="Increases by one per event this coordinator received.")
    at: float = Field(description="Unix time it was received.")
    pipeline: str
    sink: str = Field(description="The sink step's id.")
    kind: Literal["anomaly", "pattern", "alert"]
    subject: str
    data: dict[str, Any] = Field(description="The record (JSON), long values abbreviated.")


class Incident(_Answer):
    """Feed records of one key that belong together: a burst of alerts, a pattern's
    matches, an anomaly episode from its start to its end (spanflow.server.incidents)."""

    id: int
    pipeline: str
    sink: str
    kind: Literal["anomaly", "pattern", "alert"]
    subject: str = Field(description="The sink's subject of its records: names the key.")
    first_at: float = Field(description="Unix time its first record was received.")
    last_at: float = Field(description="Unix time its newest record was received.")
    count: int = Field(description="Records it gathered.")
    first_event: int = Field(description="Feed sequence of its first record.")
    last_event: int = Field(description="Feed sequence of its newest record.")
    started: str | None = Field(description="Event time of its first record, as written.")
    until: str | None = Field(description="Event time of its newest (an episode: its end).")
    episode_open: bool = Field(description="An anomaly episode that has not ended yet.")
    ended: bool = Field(description="An anomaly episode whose end row arrived.")
    peak: float | None = Field(description="An anomaly's highest score.")
    peak_field: str | None = Field(description="The field of that score.")
    latest: dict[str, Any] = Field(description="Its newest record, long values abbreviated.")
    open: bool = Field(
        default=False, description="Still going: an open episode, or a record lately."
    )
    quiet_s: float = Field(
        default=60.0, description="Seconds without a record after which it is over."
    )


class VersionFigures(_Answer):
    records: int = Field(description="Predictions this version made.")
    mean_prediction: float | None = Field(
        description="Their mean (booleans: the share of true); None: not numeric."
    )


class ShadowFigures(_Answer):
    compared: int = Field(description="Records scored by both production and the shadow.")
    agreement: float | None = Field(description="Share of them with equal predictions.")
    mean_abs_difference: float | None = Field(
        description="Mean |production − shadow| (numeric predictions)."
    )
    versions: list[int] = Field(description="Shadow versions seen.")


class ModelComparison(_Answer):
    """How the versions of a model score live records, from the sinks after its score
    steps, since this coordinator started: the canary's split and the shadow's agreement
    with production."""

    model: str
    records: int
    versions: dict[str, VersionFigures] = Field(description="By model_version.")
    shadow: ShadowFigures | None


class Upgrading(_Answer):
    """An accepted upgrade: the old version is taking its savepoint; the new one starts
    from it once every fragment stopped there."""

    pipeline: PipelineStatus
    steps: list[StepUpgradeVerdict]
