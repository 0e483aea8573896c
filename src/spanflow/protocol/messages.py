"""What nodes send the coordinators over NATS: heartbeats (with what gossip sees of
the peers), activity reports of fragments, requests to shed a fragment. Plain JSON
(pydantic), never pickled."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from spanflow.protocol.metrics import FragmentRuntime, StreamUsage
from spanflow.spec.cluster import now


class ShedRequest(BaseModel):
    """An overloaded node asks for one of its fragments to move to a peer
    (``POST /api/v1/nodes/{name}/shed``; see docs/balancing.md)."""

    model_config = ConfigDict(extra="forbid")

    fragment: str
    to: str = Field(description="The peer that should take it.")
    load: float | None = Field(default=None, description="The asking node's load score.")
    peer_load: float | None = Field(default=None, description="The peer's, as gossiped.")
    reason: str = Field(default="", max_length=500)


class ScaleReport(BaseModel):
    """A node on a Spark cluster changed how many executors it holds
    (``POST /api/v1/nodes/{name}/scaled``; see docs/cluster.md#scaling-with-load)."""

    model_config = ConfigDict(extra="forbid")

    executors_before: int = Field(ge=0)
    executors: int = Field(ge=0, description="The total it now asks the cluster for.")
    min_executors: int = Field(ge=1)
    max_executors: int = Field(ge=1)
    cores: int = Field(ge=0, description="Cores those executors hold.")
    memory_mb: int = Field(ge=0, description="Memory those executors hold.")
    pressure: float = Field(
        ge=0, description="What made it: the fragments' pressure (1: at the limit)."
    )
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
