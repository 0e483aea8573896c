"""``/api/v1/pipelines``: submit, status, metrics, cancel, savepoint, resume."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.control.coordinator import Coordinator
from spanflow.control.requests import Submission
from spanflow.protocol.rest import PipelineMetrics, PipelineStatus, ResumeBody, SubmitBody
from spanflow.server.errors import RequestError
from spanflow.spec.pipeline import PipelineSpec, format_validation_error
from spanflow.spec.topology import Topology

API = "/api/v1/pipelines"


def add_pipeline_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    @app.get(API, tags=["pipelines"], dependencies=guarded)
    async def list_pipelines() -> list[PipelineStatus]:
        return [coordinator.pipeline_status(n) for n in sorted(coordinator.state.pipelines)]

    @app.post(API, tags=["pipelines"], dependencies=guarded, status_code=201)
    async def submit(body: SubmitBody) -> PipelineStatus:
        spec = spec_of(body, coordinator.topology())
        record = await coordinator.submit(
            Submission(
                spec=spec,
                priority=body.priority,
                latency_budget=body.latency_budget,
                parallelism=body.parallelism,
            )
        )
        return coordinator.pipeline_status(record.name)

    @app.get(f"{API}/{{name}}", tags=["pipelines"], dependencies=guarded)
    async def status(name: str) -> PipelineStatus:
        return coordinator.pipeline_status(name)

    @app.get(f"{API}/{{name}}/spec", tags=["pipelines"], dependencies=guarded)
    async def spec(name: str) -> dict[str, Any]:
        """The pipeline as submitted (its spec: sources, steps, sinks)."""
        return coordinator.pipeline(name).spec.model_dump(mode="json", by_alias=True)

    @app.get(f"{API}/{{name}}/metrics", tags=["pipelines"], dependencies=guarded)
    async def pipeline_metrics(name: str) -> PipelineMetrics:
        return coordinator.pipeline_metrics(name)

    @app.post(f"{API}/{{name}}/cancel", tags=["pipelines"], dependencies=guarded)
    async def cancel(name: str) -> PipelineStatus:
        await coordinator.cancel(name)
        return coordinator.pipeline_status(name)

    @app.post(f"{API}/{{name}}/savepoint", tags=["pipelines"], dependencies=guarded)
    async def savepoint(name: str) -> PipelineStatus:
        await coordinator.savepoint(name)
        return coordinator.pipeline_status(name)

    @app.post(f"{API}/{{name}}/resume", tags=["pipelines"], dependencies=guarded)
    async def resume(name: str, body: ResumeBody | None = None) -> PipelineStatus:
        await coordinator.resume(name, body.savepoint if body else None)
        return coordinator.pipeline_status(name)


def spec_of(body: SubmitBody, topology: Topology | None = None) -> PipelineSpec:
    """The pipeline a submission names: parsed YAML (errors name the line and field)
    or a validated JSON spec."""
    if (body.yaml is None) == (body.spec is None):
        raise RequestError(422, "give exactly one of 'yaml' (pipeline file text) or 'spec' (JSON)")
    if body.yaml is not None:
        # a PipelineFileError is a 422; sources inherit what they leave out from the registry
        return load_pipeline_text(body.yaml, body.filename, topology=topology)
    try:
        return PipelineSpec.model_validate(body.spec)
    except ValidationError as exc:
        raise RequestError(
            422, f"invalid pipeline spec: {format_validation_error(exc)}", code="invalid_spec"
        ) from None
