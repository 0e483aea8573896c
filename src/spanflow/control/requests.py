"""What clients ask the control plane for: validated at the edge, decided in the rooms."""

from __future__ import annotations

from pydantic import BaseModel

from spanflow.protocol.rest import LatencyBudget, Parallelism, Priority, Registration
from spanflow.spec.pipeline import PipelineSpec

__all__ = ["Registration", "Submission"]


class Submission(BaseModel):
    """A pipeline to run, with the bounds the REST body has (``protocol.rest.SubmitBody``)."""

    spec: PipelineSpec
    priority: Priority = 0
    latency_budget: LatencyBudget = None
    parallelism: Parallelism = 1
