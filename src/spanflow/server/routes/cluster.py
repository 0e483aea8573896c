"""``/healthz``, ``/metrics`` and ``/api/v1/cluster``: who leads, how the cluster is
doing, and the control log (every decision taken)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Query, Request, Response

from spanflow.control.coordinator import Coordinator
from spanflow.control.errors import Unavailable
from spanflow.protocol.rest import ClusterInfo, ClusterMetrics, Health, LogEntry
from spanflow.server.live import log_entry
from spanflow.server.metrics import render_metrics

API = "/api/v1/cluster"


def add_cluster_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    @app.get("/healthz", tags=["cluster"])
    async def health() -> Health:
        """Never needs the token (load balancers and ``up`` poll it)."""
        return coordinator.view.health()

    @app.get("/metrics", tags=["cluster"], dependencies=guarded)
    async def metrics(request: Request) -> Response:
        """Prometheus exposition (docs/metrics.md lists every series)."""
        body, content_type = render_metrics(coordinator, getattr(request.app.state, "feed", None))
        return Response(body, media_type=content_type)

    @app.get(API, tags=["cluster"], dependencies=guarded)
    async def cluster_info() -> ClusterInfo:
        return coordinator.view.info()

    @app.get(f"{API}/metrics", tags=["cluster"], dependencies=guarded)
    async def cluster_metrics() -> ClusterMetrics:
        return coordinator.view.cluster_metrics()

    @app.get(f"{API}/log", tags=["cluster"], dependencies=guarded)
    async def control_log(
        after: int = Query(0, ge=0, description="Records after this sequence."),
        limit: int = Query(100, description="The newest this many (1 to 1000)."),
    ) -> list[LogEntry]:
        if coordinator.control_log is None:
            raise Unavailable("not_connected", "the coordinator is not connected to NATS yet")
        entries = await coordinator.control_log.history(after=after, limit=max(1, min(limit, 1000)))
        return [log_entry(seq, r) for seq, r in entries]
