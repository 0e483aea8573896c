"""Fits of a detector's normal started through the REST API.

``POST /api/v1/pipelines/{name}/detectors/{step}/fit`` runs ``spanflow detector fit`` as
a child process on the coordinator's machine, over the coordinator's NATS server (with
its secrets, to read the stored streams), on the pipeline's spec as submitted, told to
write the normals to a file and push nothing. When it has finished, the coordinator
pushes the file to the registry itself — by the leader, recorded in the control log
like every registry change — and promotes it when asked. A job that fails, or is
killed, pushes nothing.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from spanflow.ml.model_store import ModelStore
from spanflow.protocol.rest import FitBody, FitJob
from spanflow.server.errors import RequestError

if TYPE_CHECKING:
    from spanflow.control.coordinator import Coordinator
    from spanflow.spec.steps.models import DetectAnomaliesStep

OUTPUT = 4000
"""Characters of a job's output kept for its answer."""


class FitJobs:
    """The REST API's fit jobs: at most one running per pipeline and step."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.jobs: dict[tuple[str, str], FitJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def latest(self, pipeline: str, step: str) -> FitJob:
        job = self.jobs.get((pipeline, step))
        if job is None:
            raise RequestError(404, f"no fit of {pipeline}/{step} was started here", "no_fit")
        return job

    async def start(self, pipeline: str, step_id: str, body: FitBody, by: str) -> FitJob:
        from spanflow.ml.fitted import detector_step

        spec = self.coordinator.view.pipeline(pipeline).spec
        step = detector_step(spec, step_id)
        running = self.jobs.get((pipeline, step.id))
        if running is not None and running.state == "running":
            raise RequestError(409, f"a fit of {pipeline}/{step.id} is running", "fit_running")
        model = body.model or step.model_name(spec.name)
        job = FitJob(pipeline=pipeline, step=step.id, model=model, state="running",
                     started=time.time())  # fmt: skip
        self.jobs[(pipeline, step.id)] = job
        work = Path(tempfile.mkdtemp(prefix="spanflow-fit-job-"))
        (work / "pipeline.json").write_text(spec.model_dump_json())
        task = asyncio.create_task(self._run(job, step, body, work, by))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(
        self, job: FitJob, step: DetectAnomaliesStep, body: FitBody, work: Path, by: str
    ) -> None:
        try:
            code, output = await self._fit(job, body, work)
            job.output = output[-OUTPUT:]
            if code != 0:
                job.state = "failed"
                return
            job.version = await self._push(job, step, (work / "normals.json").read_bytes(), by)
            if body.promote:
                await self._promote(job, by)
            job.state = "done"
        except Exception as exc:  # the job's answer says why; the coordinator goes on
            job.state, job.output = "failed", f"{job.output}\n{type(exc).__name__}: {exc}"
        finally:
            job.finished = time.time()

    async def _fit(self, job: FitJob, body: FitBody, work: Path) -> tuple[int, str]:
        settings = self.coordinator.settings
        command = [
            sys.executable, "-m", "spanflow.cli", "detector", "fit",
            str(work / "pipeline.json"), job.step, "--nats", settings.nats_url,
            "--out", str(work / "normals.json"), "--no-push",
        ]  # fmt: skip
        if settings.data_dir:
            command += ["--data-dir", settings.data_dir]
        if body.start is not None:
            command += ["--from", body.start.isoformat()]
        if body.end is not None:
            command += ["--to", body.end.isoformat()]
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        return int(proc.returncode or 0), out.decode(errors="replace")

    async def _push(self, job: FitJob, step: DetectAnomaliesStep, data: bytes, by: str) -> int:
        from spanflow.server.routes.models import change

        store = ModelStore(self.coordinator.jetstream())
        note = f"fitted from history by a REST fit of {job.pipeline}/{job.step}"
        version = await self.coordinator.change_catalog(
            lambda: store.push(job.model, data, format="normal", features=list(step.fields),
                               note=note),
            lambda v: change(job.model, "push", by, version=v.version),
        )  # fmt: skip
        return int(version.version)

    async def _promote(self, job: FitJob, by: str) -> None:
        from spanflow.server.routes.models import change

        assert job.version is not None
        version = job.version
        store = ModelStore(self.coordinator.jetstream())
        await self.coordinator.change_catalog(
            lambda: store.promote(job.model, version),
            lambda _: change(job.model, "promote", by, version=version, stage="production"),
        )
        job.promoted = True
