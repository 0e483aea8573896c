"""The coordinator's REST API (FastAPI; OpenAPI at ``/openapi.json``, docs at ``/docs``).

Everything under ``/api/v1`` and ``/metrics`` needs ``Authorization: Bearer <token>``
whenever a token is configured; ``/healthz`` never does (load balancers and `up`
poll it). Bad input is answered with a 4xx and a message that says what is wrong.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, ValidationError

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.control import records
from spanflow.control.coordinator import Coordinator
from spanflow.control.errors import Unauthorized, Unavailable
from spanflow.control.requests import Registration, Submission
from spanflow.server import errors
from spanflow.server.errors import RequestError
from spanflow.server.metrics import render_metrics
from spanflow.server.model_routes import add_model_routes
from spanflow.server.rule_routes import add_rule_routes
from spanflow.spec.cluster import ShedRequest
from spanflow.spec.durations import Duration
from spanflow.spec.pipeline import PipelineSpec, format_validation_error
from spanflow.spec.topology import Capabilities, Link, Site, Topology

API = "/api/v1"


class SubmitBody(BaseModel):
    """A pipeline as YAML text (a pipeline file) or as a spec object (JSON)."""

    yaml: str | None = Field(default=None, description="The text of a pipeline file.")
    spec: dict[str, Any] | None = Field(default=None, description="A pipeline spec as JSON.")
    filename: str = Field(default="pipeline.yaml", description="Named in error messages.")
    priority: int = Field(default=0, ge=0, le=1000)
    latency_budget: Duration | None = Field(default=None, gt=0)
    parallelism: int = Field(default=1, ge=1, le=256)


class ResumeBody(BaseModel):
    savepoint: str | None = None


_bearer = HTTPBearer(auto_error=False)


def _authorised(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    token: str | None = request.app.state.token
    if token is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized("unauthorized", "missing or wrong bearer token")


def create_app(coordinator: Coordinator) -> FastAPI:

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await coordinator.start()
        try:
            yield
        finally:
            await coordinator.stop()

    app = FastAPI(
        title="spanflow coordinator",
        version="1",
        description="Nodes, pipelines, topology and cluster metrics of a spanflow cluster.",
        lifespan=lifespan,
    )
    app.state.token = coordinator.settings.token
    guarded = [Depends(_authorised)]

    errors.install(app)

    @app.get("/healthz", tags=["cluster"])
    async def health() -> dict[str, Any]:
        return {
            "ok": True,
            "nodes": len(coordinator.state.nodes),
            "name": coordinator.settings.name,
            "role": coordinator.role,
            "leader": coordinator.state.leader,
        }

    @app.get("/metrics", tags=["cluster"], dependencies=guarded)
    async def metrics() -> Response:
        body, content_type = render_metrics(coordinator)
        return Response(body, media_type=content_type)

    # -- cluster ------------------------------------------------------------------
    @app.get(f"{API}/cluster", tags=["cluster"], dependencies=guarded)
    async def cluster_info() -> dict[str, Any]:
        s = coordinator.settings
        return {
            "nats_url": s.nats_url,
            "hub_domain": s.hub_domain,
            "heartbeat_interval": s.heartbeat_interval,
            "failure_after": s.failure_after,
            "state_dir": s.state_dir,
            "recovered_log_records": coordinator.recovered_records,
            "log_sequence": coordinator.state.applied,
            "name": s.name,
            "role": coordinator.role,
            "leader": coordinator.state.leader,
            "leader_epoch": coordinator.state.leader_epoch,
            "leader_url": coordinator.leader_url,
        }

    @app.get(f"{API}/cluster/metrics", tags=["cluster"], dependencies=guarded)
    async def cluster_metrics() -> dict[str, Any]:
        return coordinator.cluster_metrics()

    @app.get(f"{API}/cluster/log", tags=["cluster"], dependencies=guarded)
    async def control_log(after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        if coordinator.control_log is None:
            raise Unavailable("not_connected", "the coordinator is not connected to NATS yet")
        entries = await coordinator.control_log.history(after=after, limit=max(1, min(limit, 1000)))
        return [
            {
                "seq": seq,
                "kind": r.kind,
                "at": r.at,
                "epoch": r.epoch,
                "detail": records.summary(r),
            }
            for seq, r in entries
        ]

    @app.get(f"{API}/topology", tags=["topology"], dependencies=guarded)
    async def topology() -> dict[str, Any]:
        return coordinator.topology().model_dump(mode="json", by_alias=True)

    @app.put(f"{API}/topology/sites", tags=["topology"], dependencies=guarded)
    async def put_site(site: Site) -> dict[str, Any]:
        return (await coordinator.put_site(site)).model_dump(mode="json", by_alias=True)

    @app.put(f"{API}/topology/links", tags=["topology"], dependencies=guarded)
    async def put_link(link: Link) -> dict[str, Any]:
        return (await coordinator.put_link(link)).model_dump(mode="json", by_alias=True)

    # -- nodes --------------------------------------------------------------------
    @app.get(f"{API}/nodes", tags=["nodes"], dependencies=guarded)
    async def list_nodes() -> list[dict[str, Any]]:
        return [coordinator.node_status(n) for n in sorted(coordinator.state.nodes)]

    @app.post(f"{API}/nodes", tags=["nodes"], dependencies=guarded, status_code=201)
    async def register(reg: Registration) -> dict[str, Any]:
        record = await coordinator.register_node(reg)
        s = coordinator.settings
        return {
            "node": record.model_dump(mode="json", by_alias=True),
            **coordinator.connection_for(record.name),
            "heartbeat_interval": s.heartbeat_interval,
            "gossip_profile": s.gossip_profile,
        }

    @app.post(f"{API}/nodes/{{name}}/shed", tags=["nodes"], dependencies=guarded)
    async def shed(name: str, request: ShedRequest) -> dict[str, Any]:
        """An overloaded node asks for one of its fragments to move to a peer (the
        agent's shedding policy sends it; an operator may too)."""
        return await coordinator.shed(name, request)

    @app.get(f"{API}/nodes/{{name}}", tags=["nodes"], dependencies=guarded)
    async def get_node(name: str) -> dict[str, Any]:
        return coordinator.node_status(name)

    @app.post(f"{API}/nodes/{{name}}/drain", tags=["nodes"], dependencies=guarded)
    async def drain(name: str) -> dict[str, Any]:
        await coordinator.drain_node(name)
        return coordinator.node_status(name)

    @app.put(f"{API}/nodes/{{name}}/capabilities", tags=["nodes"], dependencies=guarded)
    async def capabilities(name: str, caps: Capabilities) -> dict[str, Any]:
        await coordinator.update_capabilities(name, caps)
        return coordinator.node_status(name)

    @app.delete(f"{API}/nodes/{{name}}", tags=["nodes"], dependencies=guarded, status_code=204)
    async def remove(name: str) -> Response:
        await coordinator.remove_node(name)
        return Response(status_code=204)

    # -- pipelines ----------------------------------------------------------------
    @app.get(f"{API}/pipelines", tags=["pipelines"], dependencies=guarded)
    async def list_pipelines() -> list[dict[str, Any]]:
        return [coordinator.pipeline_status(n) for n in sorted(coordinator.state.pipelines)]

    @app.post(f"{API}/pipelines", tags=["pipelines"], dependencies=guarded, status_code=201)
    async def submit(body: SubmitBody) -> dict[str, Any]:
        spec = _spec_of(body, coordinator.topology())
        record = await coordinator.submit(
            Submission(
                spec=spec,
                priority=body.priority,
                latency_budget=body.latency_budget,
                parallelism=body.parallelism,
            )
        )
        return coordinator.pipeline_status(record.name)

    @app.get(f"{API}/pipelines/{{name}}", tags=["pipelines"], dependencies=guarded)
    async def status(name: str) -> dict[str, Any]:
        return coordinator.pipeline_status(name)

    @app.get(f"{API}/pipelines/{{name}}/spec", tags=["pipelines"], dependencies=guarded)
    async def spec(name: str) -> dict[str, Any]:
        return coordinator.pipeline(name).spec.model_dump(mode="json", by_alias=True)

    @app.get(f"{API}/pipelines/{{name}}/metrics", tags=["pipelines"], dependencies=guarded)
    async def pipeline_metrics(name: str) -> dict[str, Any]:
        return coordinator.pipeline_metrics(name)

    @app.post(f"{API}/pipelines/{{name}}/cancel", tags=["pipelines"], dependencies=guarded)
    async def cancel(name: str) -> dict[str, Any]:
        await coordinator.cancel(name)
        return coordinator.pipeline_status(name)

    @app.post(f"{API}/pipelines/{{name}}/savepoint", tags=["pipelines"], dependencies=guarded)
    async def savepoint(name: str) -> dict[str, Any]:
        await coordinator.savepoint(name)
        return coordinator.pipeline_status(name)

    @app.post(f"{API}/pipelines/{{name}}/resume", tags=["pipelines"], dependencies=guarded)
    async def resume(name: str, body: ResumeBody | None = None) -> dict[str, Any]:
        await coordinator.resume(name, body.savepoint if body else None)
        return coordinator.pipeline_status(name)

    add_model_routes(app, coordinator, guarded)
    add_rule_routes(app, coordinator, guarded)
    return app


def _spec_of(body: SubmitBody, topology: Topology | None = None) -> PipelineSpec:
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
