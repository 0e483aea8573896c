"""``spanflow detector rebaseline``: an operator accepts a key's behaviour as normal;
``spanflow detector fit``: a detector's normal per key fitted from stored history."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from spanflow.cli.cluster import DEFAULT_URL, Api, CoordinatorOption, TokenOption
from spanflow.cli.common import (
    DataDirOption,
    NatsOption,
    RegistryCoordinatorOption,
    RegistryTokenOption,
    app,
    console,
)

if TYPE_CHECKING:
    from spanflow.spark.detector_fit import FitResult
    from spanflow.spec.pipeline import PipelineSpec
    from spanflow.spec.steps.models import DetectAnomaliesStep

detector_app = typer.Typer(
    no_args_is_help=True,
    help="Anomaly detectors of running pipelines (detect_anomalies steps).",
)
app.add_typer(detector_app, name="detector")


@detector_app.command("rebaseline")
def rebaseline(
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    key: Annotated[
        str | None,
        typer.Argument(
            help="The key whose current behaviour is normal (a compound key's values joined "
            "by commas: site-1,pump-3).",
            show_default=False,
        ),
    ] = None,
    every_key: Annotated[
        bool, typer.Option("--every-key", help="Rebaseline every key of the step.")
    ] = False,
    step: Annotated[
        str | None,
        typer.Option(
            "--step", help="The detect_anomalies step (default: the pipeline's only one)."
        ),
    ] = None,
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Accept KEY's current behaviour as normal: from the next micro-batch the detector
    forgets what it learnt of KEY and learns it afresh (its warm-up first), and an open
    anomaly episode of KEY ends. Written to the control log."""
    from spanflow.cli.common import SpanflowError
    from spanflow.ml.rebaseline import EVERY_KEY
    from spanflow.protocol.rest import RebaselineBody

    if (key is None) == (not every_key):
        raise SpanflowError("give a KEY or --every-key (not both)")
    body = RebaselineBody(step=step, key=EVERY_KEY if every_key else key)
    done = Api(coordinator_url, token).typed(lambda c: c.rebaseline(pipeline, body))
    which = "every key" if done.key == EVERY_KEY else f"key {done.key}"
    console.print(
        f"{done.pipeline}/{done.step}: {which} rebaselined (generation {done.generation}); "
        "it learns afresh from its next readings"
    )


@detector_app.command("fit")
def fit(
    pipeline: Annotated[
        str, typer.Argument(help="The pipeline: its name (on the coordinator) or its file.")
    ],
    step: Annotated[
        str | None,
        typer.Argument(help="The detect_anomalies step (default: the pipeline's only one)."),
    ] = None,
    start: Annotated[
        datetime | None,
        typer.Option("--from", help="Fit on readings from this event time (ISO 8601)."),
    ] = None,
    end: Annotated[
        datetime | None,
        typer.Option("--to", help="... up to this one, excluded (default: all stored)."),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name", help="Registry model (default: the step's model, or <pipeline>-<step>)."
        ),
    ] = None,
    promote: Annotated[
        bool, typer.Option("--promote", help="Promote the new version to production.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the fitted normals to this file.")
    ] = None,
    no_push: Annotated[
        bool, typer.Option("--no-push", help="Only write --out: push nothing to the registry.")
    ] = False,
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Fit a multivariate detector's normal per key on the history its pipeline has
    stored (a Spark job over the stream, read as the pipeline reads it) and push the
    normals to the model registry as a new staging version. Once promoted, a key's
    fitted normal replaces what it learnt online at the step's next micro-batch; keys
    without one go on learning online. A fit stopped half way pushes nothing."""
    from spanflow.cli.common import SpanflowError

    try:
        if no_push and out is None:
            raise SpanflowError("--no-push needs --out (where the normals go)")
        spec = _pipeline_spec(pipeline, coordinator, token)
        result, chosen = _run_fit(spec, step, start, end, nats, data_dir)
    except SpanflowError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    model = name or chosen.model_name(spec.name)
    data = result.normals.to_bytes()
    if out is not None:
        out.write_bytes(data)
    if no_push:
        console.print(f"fitted {len(result.normals.keys)} key(s) on {result.rows:,} readings")
        return
    version = _push(model, data, chosen.fields, result, promote, nats, data_dir, coordinator, token)
    few = len(result.skipped)
    skipped = f"; {few} key(s) with too few readings left out" if few else ""
    console.print(
        f"{spec.name}/{chosen.id}: fitted {len(result.normals.keys)} key(s) on "
        f"{result.rows:,} readings{skipped}; pushed {model} version {version}"
        + (" — in production" if promote else " — stage: staging (spanflow model promote)")
    )


def _pipeline_spec(target: str, coordinator: str | None, token: str | None) -> PipelineSpec:
    """The pipeline from its file, or as submitted to the coordinators."""
    from spanflow.cli.common import SpanflowError, load_target
    from spanflow.local.api import Api as Rest
    from spanflow.spec.pipeline import PipelineSpec

    if Path(target).is_file():
        return load_target(target)[0]
    if not coordinator:
        raise SpanflowError(f"no pipeline file {target!r}: give one, or --coordinator")
    found = Rest(coordinator, token).call("GET", f"/api/v1/pipelines/{target}/spec")
    return PipelineSpec.model_validate(found)


def _run_fit(
    spec: PipelineSpec,
    step_id: str | None,
    start: datetime | None,
    end: datetime | None,
    nats: str | None,
    data_dir: Path | None,
) -> tuple[FitResult, DetectAnomaliesStep]:
    """The fit job on a local Spark session, over the NATS server holding the history."""
    from spanflow.cli.common import data_dir_or_default, nats_url
    from spanflow.ml.fitted import detector_step
    from spanflow.spark.detector_fit import fit_in_session

    step = detector_step(spec, step_id)
    with (
        nats_url(nats, data_dir_or_default(data_dir)) as url,
        console.status(f"fitting {spec.name}/{step.id} on its stored history …"),
    ):
        return fit_in_session(spec, step, nats_url=url, start=start, end=end), step


def _push(
    model: str,
    data: bytes,
    fields: tuple[str, ...],
    result: FitResult,
    promote: bool,
    nats: str | None,
    data_dir: Path | None,
    coordinator: str | None,
    token: str | None,
) -> int:
    """Push the normals as the model's next version (and promote it when asked)."""
    from urllib.parse import urlencode

    from spanflow.cli.models import MODELS

    note = f"fitted from history by spanflow detector fit: {len(result.normals.keys)} keys"
    if coordinator:
        query = urlencode({"format": "normal", "features": ",".join(fields), "note": note})
        pushed = MODELS.rest(coordinator, token, "POST", f"{model}/versions?{query}", content=data)
        version = int(pushed["version"])
        if promote:
            body = {"version": version, "stage": "production"}
            MODELS.rest(coordinator, token, "POST", f"{model}/promote", body=body)
        return version

    async def work(store: Any) -> int:
        added = await store.push(model, data, format="normal", features=list(fields), note=note)
        if promote:
            await store.promote(model, added.version)
        return int(added.version)

    return int(MODELS.run(nats, data_dir, work))
