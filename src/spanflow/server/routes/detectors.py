"""``/api/v1/pipelines/{name}/detectors/{step}/fit``: fit a multivariate detector's
normal per key on the stored history (see :mod:`spanflow.server.fits`)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from spanflow.control.coordinator import Coordinator
from spanflow.control.errors import NotLeader
from spanflow.errors import SpecError
from spanflow.protocol.rest import FitBody, FitJob
from spanflow.server.errors import RequestError
from spanflow.server.fits import FitJobs
from spanflow.server.routes.models import principal

API = "/api/v1/pipelines/{name}/detectors/{step}/fit"


def add_detector_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    jobs = FitJobs(coordinator)

    @app.post(API, tags=["pipelines"], dependencies=guarded, status_code=202)
    async def fit(name: str, step: str, body: FitBody, request: Request) -> FitJob:
        """Start a fit of the step's normal per key on the history its pipeline stored
        (a Spark job on the coordinator's machine); when it has finished the leader
        pushes the normals as the next version of the step's model (and promotes it
        when asked), recorded in the control log. Poll the GET for how it went."""
        if not coordinator.leading:
            raise NotLeader(coordinator.state.leader, coordinator.leader_url)
        try:
            return await jobs.start(name, step, body, principal(request))
        except SpecError as exc:
            raise RequestError(422, str(exc), "not_a_fit") from None

    @app.get(API, tags=["pipelines"], dependencies=guarded)
    async def fit_status(name: str, step: str) -> FitJob:
        """The latest fit of the step started on this coordinator, and how it went."""
        return jobs.latest(name, step)
