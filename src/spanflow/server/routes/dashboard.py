"""The web dashboard (``/ui``), the REST reference (``/docs``, Swagger UI served from
the vendored copy: no CDN), and the live data the dashboard reads: the event stream
(``/api/v1/stream``) and recent samples per pipeline (``/api/v1/pipelines/{name}/history``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from spanflow.control.coordinator import Coordinator
from spanflow.protocol.rest import DataEvent, Incident, ModelComparison, PipelineHistory
from spanflow.server import live
from spanflow.server.feed import EventFeed
from spanflow.web import STATIC

UI = "/ui"
VENDOR = f"{UI}/vendor"


def add_dashboard_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    history = live.History()
    feed = EventFeed()
    app.state.history = history
    app.state.feed = feed
    app.mount(UI, StaticFiles(directory=STATIC, html=True), name="ui")

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse(f"{UI}/")

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="spanflow coordinator — REST API",
            swagger_js_url=f"{VENDOR}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{VENDOR}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{VENDOR}/swagger-ui/favicon-32x32.png",
        )

    @app.get("/api/v1/stream", tags=["dashboard"], dependencies=guarded)
    async def stream(
        request: Request,
        interval: float = Query(1.0, ge=0.2, le=60, description="Seconds between snapshots."),
        after: int = Query(0, ge=0, description="Send control-log records after this one."),
        after_event: int = Query(0, ge=0, description="Send feed events after this one."),
    ) -> StreamingResponse:
        """Server-sent events: ``snapshot`` (a Snapshot) every ``interval`` seconds,
        ``log`` (a LogEntry) for every new control-log record, ``data`` (a DataEvent)
        for every anomaly, pattern match or alert a pipeline writes."""
        events = live.stream(
            coordinator, history, feed, interval, request.is_disconnected, after, after_event
        )
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @app.get("/api/v1/events", tags=["dashboard"], dependencies=guarded)
    async def data_events(
        after: int = Query(0, ge=0, description="Events after this sequence number."),
        kind: str | None = Query(None, pattern="^(anomaly|pattern|alert)$"),
        pipeline: str | None = None,
        limit: int = Query(200, ge=1, le=500, description="The newest this many."),
    ) -> list[DataEvent]:
        """Anomalies, pattern matches and alerts pipelines wrote lately (the event
        feed: the newest 500 this coordinator received; see a sink's ``feed``)."""
        return feed.after(after, kind=kind, pipeline=pipeline, limit=limit)

    @app.get("/api/v1/incidents", tags=["dashboard"], dependencies=guarded)
    async def incidents(
        kind: str | None = Query(None, pattern="^(anomaly|pattern|alert)$"),
        pipeline: str | None = None,
        limit: int = Query(100, ge=1, le=300, description="The newest this many."),
    ) -> list[Incident]:
        """The event feed's records grouped as incidents, newest first: records of one
        sink and key that keep coming (under a minute apart) are one incident, an
        anomaly episode's start and end are one; each with its count, first and last
        time, event-time span, peak and newest record."""
        now = time.time()
        found = feed.incidents.newest(kind=kind, pipeline=pipeline, limit=limit)
        return [feed.incidents.shown(i, now) for i in found]

    @app.get("/api/v1/models/{name}/comparison", tags=["models"], dependencies=guarded)
    async def model_comparison(name: str) -> ModelComparison:
        """How the model's versions score live records (from the sinks after its score
        steps, since this coordinator started): records per version and their mean
        prediction (a canary's split), and the shadow's agreement with production."""
        return feed.comparison(name)

    @app.get("/api/v1/pipelines/{name}/history", tags=["pipelines"], dependencies=guarded)
    async def pipeline_history(name: str) -> PipelineHistory:
        """Recent samples of each of the pipeline's fragments (ten minutes), oldest first."""
        shown = coordinator.view.shown_fragments(name)
        return PipelineHistory(
            name=name, interval_s=live.SAMPLE_INTERVAL, fragments=history.of(shown)
        )


@contextlib.asynccontextmanager
async def sampling(app: FastAPI, coordinator: Coordinator) -> AsyncIterator[None]:
    """Sample fragments into the dashboard's history and keep the event feed subscribed
    while the app runs."""
    task = asyncio.create_task(live.sample_forever(coordinator, app.state.history, app.state.feed))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=10)  # a stop never hangs on the sampler
        with contextlib.suppress(Exception):
            await asyncio.wait_for(app.state.feed.close(), 10)
