"""``/api/v1/pipelines``: submit, status, metrics, cancel, savepoint, resume, and
rebaselining a detector's key."""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from pydantic import ValidationError

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.control.coordinator import Coordinator
from spanflow.control.requests import Submission
from spanflow.errors import PipelineFileError
from spanflow.protocol.rest import (
    FragmentPlan,
    PipelineMetrics,
    PipelineStatus,
    RebaselineBody,
    Rebaselined,
    ResumeBody,
    StepUpgradeVerdict,
    SubmitBody,
    Upgrading,
)
from spanflow.server.errors import RequestError
from spanflow.spec.pipeline import PipelineSpec, format_validation_error
from spanflow.spec.topology import Topology

API = "/api/v1/pipelines"


def add_pipeline_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    """The pipelines' REST routes: what they are (:func:`_add_pipeline_reads`) and
    their lifecycle (submit, cancel, savepoint, resume, upgrade, rebaseline)."""
    _add_pipeline_reads(app, coordinator, guarded)

    @app.post(API, tags=["pipelines"], dependencies=guarded, status_code=201)
    async def submit(body: SubmitBody) -> PipelineStatus:
        spec = await parse_submission(body, coordinator.view.topology())
        record = await coordinator.submit(
            Submission(
                spec=spec,
                priority=body.priority,
                latency_budget=body.latency_budget,
                parallelism=body.parallelism,
            )
        )
        return coordinator.view.pipeline_status(record.name)

    @app.post(f"{API}/{{name}}/cancel", tags=["pipelines"], dependencies=guarded)
    async def cancel(name: str) -> PipelineStatus:
        await coordinator.cancel(name)
        return coordinator.view.pipeline_status(name)

    @app.post(f"{API}/{{name}}/savepoint", tags=["pipelines"], dependencies=guarded)
    async def savepoint(name: str) -> PipelineStatus:
        await coordinator.savepoint(name)
        return coordinator.view.pipeline_status(name)

    @app.post(f"{API}/{{name}}/resume", tags=["pipelines"], dependencies=guarded)
    async def resume(name: str, body: ResumeBody | None = None) -> PipelineStatus:
        await coordinator.resume(name, body.savepoint if body else None)
        return coordinator.view.pipeline_status(name)

    @app.post(f"{API}/{{name}}/upgrade", tags=["pipelines"], dependencies=guarded)
    async def upgrade(name: str, body: SubmitBody) -> Upgrading:
        """A new version of a running pipeline that keeps its state: each stateful step
        is matched to the old version's by id and checked (kept, changed, added,
        dropped); a version whose state cannot be kept is refused (409
        ``upgrade_refused``, the reason per step) and the old one keeps running.
        Otherwise the old version takes a savepoint and the new one starts from it.
        Priority, latency budget and parallelism stay the pipeline's."""
        spec = await parse_submission(body, coordinator.view.topology())
        if spec.name != name:
            raise RequestError(
                422, f"the new version is named {spec.name!r}, not {name!r}", "name_mismatch"
            )
        report = await coordinator.upgrade(spec)
        return Upgrading(
            pipeline=coordinator.view.pipeline_status(name),
            steps=[StepUpgradeVerdict.model_validate(s) for s in report.to_json()],
        )

    @app.post(f"{API}/{{name}}/rebaseline", tags=["pipelines"], dependencies=guarded)
    async def rebaseline(name: str, body: RebaselineBody, request: Request) -> Rebaselined:
        """Accept a key's current behaviour as normal in a detect_anomalies step: from its
        next micro-batch the step forgets what it learnt of that key and learns it
        afresh (warm-up included); an open episode ends. In the control log."""
        by = str(getattr(request.state, "principal", None) or "")
        done = await coordinator.rebaseline(name, body.step, body.key, body.record, by)
        return Rebaselined(
            pipeline=done.pipeline, step=done.step, key=done.key, generation=done.generation
        )


def _add_pipeline_reads(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    @app.get(API, tags=["pipelines"], dependencies=guarded)
    async def list_pipelines() -> list[PipelineStatus]:
        return coordinator.view.pipeline_statuses()

    @app.get(f"{API}/{{name}}", tags=["pipelines"], dependencies=guarded)
    async def status(name: str) -> PipelineStatus:
        return coordinator.view.pipeline_status(name)

    @app.get(f"{API}/{{name}}/spec", tags=["pipelines"], dependencies=guarded)
    async def spec(name: str) -> dict[str, Any]:
        """The pipeline as submitted (its spec: sources, steps, sinks), secrets masked."""
        return coordinator.view.pipeline(name).spec.secret_free()

    @app.get(f"{API}/{{name}}/plan", tags=["pipelines"], dependencies=guarded)
    async def plan(name: str) -> list[FragmentPlan]:
        """The fragments the planner cut the pipeline into: id, kind (local at a site,
        global), site, node, and the fragment's own steps (type, inputs) — with those the
        planner added (a site's partial aggregate, the read of another fragment's output,
        ``schema_of`` naming the step it reads) — secrets masked."""
        return coordinator.view.plan(name)

    @app.get(f"{API}/{{name}}/metrics", tags=["pipelines"], dependencies=guarded)
    async def pipeline_metrics(name: str) -> PipelineMetrics:
        return coordinator.view.pipeline_metrics(name)


LARGE_FILE = 64 * 1024
"""Characters of YAML above which a file is parsed in a worker process: PyYAML parses
about 40 KB a second here and holds the interpreter while it does, so a 1.6 MB file in
a thread still stalled the event loop (``/healthz`` 1.8 s, the leader's lease at risk)."""
_parser: ProcessPoolExecutor | None = None


async def parse_submission(body: SubmitBody, topology: Topology | None) -> PipelineSpec:
    """:func:`spec_of` off the event loop: in a thread for the usual small file, in a
    worker process for a large one."""
    if len(body.yaml or "") <= LARGE_FILE:
        return await asyncio.to_thread(spec_of, body, topology)
    global _parser
    if _parser is None:
        _parser = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    outcome = await asyncio.get_running_loop().run_in_executor(
        _parser, _spec_or_error, body, topology
    )
    if isinstance(outcome, PipelineSpec):
        return outcome
    if outcome[0] == "file":
        raise PipelineFileError(outcome[1], outcome[2])
    raise RequestError(outcome[1], outcome[2], outcome[3])


def _spec_or_error(body: SubmitBody, topology: Topology | None) -> PipelineSpec | tuple[Any, ...]:
    """In the worker: the spec, or the error as plain values (spanflow's errors do not
    survive pickling with their fields)."""
    try:
        return spec_of(body, topology)
    except PipelineFileError as exc:
        return ("file", exc.path, exc.problems)
    except RequestError as exc:
        return ("request", exc.status, str(exc), exc.code)


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
