"""What clients ask the control plane for: validated at the edge, decided in the rooms."""

from __future__ import annotations

from pydantic import BaseModel, Field

from spanflow.spec.durations import Duration
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.topology import Capabilities, HostedStream


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
    sinks: tuple[str, ...] | None = None


class Submission(BaseModel):
    spec: PipelineSpec
    priority: int = Field(default=0, ge=0, le=1000)
    latency_budget: Duration | None = Field(default=None, gt=0)
    parallelism: int = Field(default=1, ge=1, le=256)
