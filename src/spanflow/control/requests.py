"""What clients ask the control plane for: validated at the edge, decided in the rooms."""

from __future__ import annotations

from pydantic import BaseModel, Field

from spanflow.protocol.rest import Registration
from spanflow.spec.durations import Duration
from spanflow.spec.pipeline import PipelineSpec

__all__ = ["Registration", "Submission"]


class Submission(BaseModel):
    spec: PipelineSpec
    priority: int = Field(default=0, ge=0, le=1000)
    latency_budget: Duration | None = Field(default=None, gt=0)
    parallelism: int = Field(default=1, ge=1, le=256)
