"""``spanflow model push/list/promote/rollback``: the model registry from the shell."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import typer
from rich.table import Table

from spanflow.cli.catalog import Catalog, pushed_at
from spanflow.cli.common import (
    DataDirOption,
    NatsOption,
    RegistryCoordinatorOption,
    RegistryTokenOption,
    app,
    console,
)

model_app = typer.Typer(
    no_args_is_help=True,
    help="The model registry: versions, stages (staging, production, archived), rollback.",
)
app.add_typer(model_app, name="model")


def _manifest(view: dict[str, Any]) -> Any:
    from spanflow.ml.registry import ModelManifest

    return ModelManifest.model_validate({k: v for k, v in view.items() if k != "production"})


MODELS = Catalog("models", "spanflow.ml.model_store", _manifest)


@model_app.command("push")
def push(
    file: Annotated[
        Path,
        typer.Argument(
            help="The model file (.onnx; .json, a detector's normals from 'spanflow detector "
            "fit'; or a pickled River model)."
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="Model name.")],
    features: Annotated[
        str, typer.Option("--features", help="The input fields, in the model's order: a,b,c.")
    ],
    format: Annotated[
        str | None,
        typer.Option("--format", help="onnx, normal or river (default: by file suffix)."),
    ] = None,
    note: Annotated[str, typer.Option(help="A note kept with the version.")] = "",
    accelerator: Annotated[
        list[str] | None,
        typer.Option(
            "--accelerator", help="The model needs a node with this accelerator (repeatable)."
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="The model needs a node with this tag (repeatable)."),
    ] = None,
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Store a model file as the next version of NAME, in staging.

    --accelerator/--tag say what a node needs to run the model (for every version):
    pipelines that score with it are placed on such nodes when submitted.
    A River model is a pickle, which is code: push only files you would run."""
    from spanflow.errors import InvalidModel

    if not file.is_file():
        raise InvalidModel(f"no model file {file}")
    by_suffix = {".onnx": "onnx", ".json": "normal"}
    kind = format or by_suffix.get(file.suffix, "river")
    if kind not in ("onnx", "river", "normal"):
        raise InvalidModel(f"--format {kind!r}: use onnx, river or normal")
    data = file.read_bytes()
    names = [f.strip() for f in features.split(",") if f.strip()]
    if coordinator:
        query = urlencode(
            {"format": kind, "features": ",".join(names), "note": note}
            | ({"accelerators": ",".join(accelerator)} if accelerator else {})
            | ({"tags": ",".join(tag)} if tag else {})
        )
        pushed = MODELS.rest(coordinator, token, "POST", f"{name}/versions?{query}", content=data)
        number, size, digest = pushed["version"], pushed["size"], pushed["sha256"]
    else:
        version = MODELS.run(
            nats,
            data_dir,
            lambda store: store.push(
                name,
                data,
                format=kind,
                features=names,
                note=note,
                accelerators=accelerator,
                tags=tag,
            ),
        )
        number, size, digest = version.version, version.size, version.sha256
    console.print(
        f"pushed {name} version {number} ({kind}, {size:,} bytes, "
        f"sha256 {digest[:12]}…) — stage: staging"
    )


@model_app.command("list")
def list_models(
    name: Annotated[str | None, typer.Argument(help="One model's versions.")] = None,
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Models and their versions, stages and digests."""
    manifests = MODELS.manifests(name, nats, data_dir, coordinator, token)
    if not manifests:
        console.print("no models in the registry")
        return
    table = Table()
    for column in ("model", "version", "stage", "format", "inputs", "sha256", "pushed", "note"):
        table.add_column(column, no_wrap=column in ("model", "version", "stage", "format"))
    for manifest in manifests:
        for v in manifest.versions:
            table.add_row(
                manifest.name,
                str(v.version),
                v.stage,
                v.format,
                ", ".join(v.inputs),
                v.sha256[:12],
                pushed_at(v.created),
                v.note,
            )
    console.print(table)


@model_app.command("promote")
def promote(
    name: Annotated[str, typer.Argument(help="Model name.")],
    version: Annotated[int, typer.Argument(help="Version to promote.")],
    stage: Annotated[
        str, typer.Option(help="production (default), staging or archived.")
    ] = "production",
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Move a version to a stage; to production archives the version there before."""
    from spanflow.errors import ModelError

    if stage not in ("production", "staging", "archived"):
        raise ModelError(f"--stage {stage!r}: use production, staging or archived")
    if coordinator:
        body = {"version": version, "stage": stage}
        production = MODELS.rest(coordinator, token, "POST", f"{name}/promote", body=body)[
            "production"
        ]
    else:
        production = MODELS.run(
            nats, data_dir, lambda store: store.promote(name, version, stage)
        ).production
    console.print(f"{name} version {version} → {stage} (production: {production})")


@model_app.command("rollback")
def rollback(
    name: Annotated[str, typer.Argument(help="Model name.")],
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Put the previous production version of NAME back in production."""
    if coordinator:
        production = MODELS.rest(coordinator, token, "POST", f"{name}/rollback")["production"]
    else:
        production = MODELS.run(nats, data_dir, lambda store: store.rollback(name)).production
    console.print(f"{name}: production is version {production} again")


@model_app.command("publish")
def publish(
    name: Annotated[str, typer.Argument(help="The name learn steps publish as (publish_as).")],
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Ask every learn step publishing as NAME to push its learnt models now.

    Each key's model is pushed as a staging version at that key's next batch (an
    unchanged model is not pushed again); promote it centrally when it is good."""
    if coordinator:
        number = MODELS.rest(coordinator, token, "POST", f"{name}/publish")["request"]
    else:
        number = MODELS.run(nats, data_dir, lambda store: store.request_publication(name))
    console.print(
        f"publish request {number} for {name}: each key's model is pushed at its next batch"
    )
