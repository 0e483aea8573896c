"""The coordinator's REST API (FastAPI; OpenAPI at ``/openapi.json``, docs at ``/docs``).

Everything under ``/api/v1`` and ``/metrics`` needs ``Authorization: Bearer <token>``
whenever a token is configured — reads too, unless ``public_reads`` is set (then GETs
are open and only writes need it); ``/healthz``, the dashboard's static files (``/ui``)
and the REST reference (``/docs``) never do. Bad input is answered with a 4xx and a
message that says what is wrong.

Requests are bounded before login (spanflow.security.limits): the token is checked
before a body is read, a body is at most :data:`MAX_BODY` bytes (a model file
:data:`~spanflow.ml.model_store.MAX_FILE`), and addresses that keep sending wrong
tokens are throttled.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from spanflow.control.coordinator import Coordinator
from spanflow.control.errors import Unauthorized
from spanflow.ml.model_store import MAX_FILE
from spanflow.security.environment import revoked_nodes_from_env
from spanflow.security.limits import RequestLimits
from spanflow.server import errors
from spanflow.server.principals import authenticator, permits
from spanflow.server.routes.cluster import add_cluster_routes
from spanflow.server.routes.dashboard import add_dashboard_routes, sampling
from spanflow.server.routes.detectors import add_detector_routes
from spanflow.server.routes.models import add_model_routes
from spanflow.server.routes.nodes import add_node_routes
from spanflow.server.routes.pipelines import add_pipeline_routes
from spanflow.server.routes.rules import add_rule_routes
from spanflow.server.routes.topology import add_topology_routes

_bearer = HTTPBearer(auto_error=False)
GUARDED_PREFIXES = ("/api/", "/metrics")
MAX_BODY = 2 * 1024 * 1024
"""Bytes a request body may have (a pipeline file, a rule set): the largest real
pipeline files are tens of kilobytes."""


def _authorised(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """The route's own check (and the lock icon in /docs): the request limits in front
    of the app already authenticated the token and left who holds it in the state."""
    if request.app.state.token is None:
        return
    if request.app.state.public_reads and request.method in ("GET", "HEAD"):
        return
    if getattr(request.state, "principal", None) is None:
        raise Unauthorized("unauthorized", "missing or wrong bearer token")


def _limit_for(path: str) -> int:
    """A model version's file may be larger than any other body."""
    if path.startswith("/api/v1/models/") and path.endswith("/versions"):
        return MAX_FILE
    return MAX_BODY


def create_app(coordinator: Coordinator) -> FastAPI:

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await coordinator.start()
        try:
            async with sampling(app, coordinator):
                yield
        finally:
            await coordinator.stop()

    app = FastAPI(
        title="spanflow coordinator",
        version="1",
        description="Nodes, pipelines, topology and cluster metrics of a spanflow cluster.",
        lifespan=lifespan,
        docs_url=None,  # served from the vendored Swagger UI (routes/dashboard.py)
        redoc_url=None,  # ReDoc would load from a CDN
    )
    app.state.token = coordinator.settings.token
    app.state.public_reads = coordinator.settings.public_reads
    guarded = [Depends(_authorised)]

    errors.install(app)
    add_cluster_routes(app, coordinator, guarded)
    add_topology_routes(app, coordinator, guarded)
    add_node_routes(app, coordinator, guarded)
    add_pipeline_routes(app, coordinator, guarded)
    add_detector_routes(app, coordinator, guarded)
    add_model_routes(app, coordinator, guarded)
    add_rule_routes(app, coordinator, guarded)
    add_dashboard_routes(app, coordinator, guarded)
    public_reads = coordinator.settings.public_reads

    token = coordinator.settings.token

    def needs_token(method: str, path: str) -> bool:
        if token is None or not path.startswith(GUARDED_PREFIXES):
            return False
        return not (public_reads and method in ("GET", "HEAD"))

    app.add_middleware(
        RequestLimits,
        authenticate=authenticator(
            token, coordinator.settings.node_token_key, revoked_nodes_from_env()
        ),
        guarded=needs_token,
        permits=permits,
        limit_for=_limit_for,
    )
    return app
