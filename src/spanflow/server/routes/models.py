"""REST endpoints of the model registry (``/api/v1/models``), token-protected like the
rest of the API. A model file is uploaded as the raw request body; a River model is
a pickle, i.e. code, so the upload is accepted only from a caller holding the token
(see docs/ml.md, "the trust boundary")."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, Field

from spanflow.control.coordinator import Coordinator
from spanflow.ml.model_store import MAX_FILE, ModelStore
from spanflow.ml.registry import ModelManifest, ModelVersion, Stage
from spanflow.protocol.rest import PublicationRequested
from spanflow.server.errors import RequestError

API = "/api/v1/models"


class ModelView(BaseModel):
    """A model's manifest as the API shows it: with the version in production."""

    name: str
    versions: tuple[ModelVersion, ...]
    history: tuple[int, ...] = Field(description="Versions that were in production, oldest first.")
    accelerators: tuple[str, ...]
    tags: tuple[str, ...]
    production: int | None = Field(description="The version in production (None: none).")

    @classmethod
    def of(cls, manifest: ModelManifest) -> ModelView:
        return cls(**manifest.model_dump(), production=manifest.production)


class PromoteBody(BaseModel):
    version: int = Field(ge=1)
    stage: Stage = "production"


def _list(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def principal(request: Request) -> str:
    """Who asked, as the API's authentication named them ('' when open)."""
    return str(getattr(request.state, "principal", None) or "")


def add_model_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    """Reads from the store; writes by the leader, each in the control log
    (:meth:`Coordinator.change_catalog`)."""

    def store() -> ModelStore:
        return ModelStore(coordinator.jetstream())

    @app.get(API, tags=["models"], dependencies=guarded)
    async def list_models() -> list[ModelView]:
        return [ModelView.of(manifest) for manifest in await store().every()]

    @app.get(f"{API}/{{name}}", tags=["models"], dependencies=guarded)
    async def get_model(name: str) -> ModelView:
        manifest, _ = await store().manifest(name)
        return ModelView.of(manifest)

    @app.post(f"{API}/{{name}}/versions", tags=["models"], dependencies=guarded, status_code=201)
    async def push(
        name: str,
        request: Request,
        format: Annotated[str, Query(pattern="^(onnx|river|normal)$")],
        features: Annotated[str, Query(description="Input fields, in order: a,b,c")],
        note: str = "",
        accelerators: Annotated[
            str | None, Query(description="Accelerators a node needs to run the model: gpu,tpu")
        ] = None,
        tags: Annotated[str | None, Query(description="Tags a node needs to run it: a,b")] = None,
    ) -> ModelVersion:
        data = await request.body()
        if not data:
            raise RequestError(422, "send the model file as the request body")
        if len(data) > MAX_FILE:
            raise RequestError(413, f"model file is {len(data):,} bytes; at most {MAX_FILE:,}")
        names = [f.strip() for f in features.split(",") if f.strip()]
        by = principal(request)
        return await coordinator.change_catalog(
            lambda: store().push(
                name,
                data,
                format=format,  # type: ignore[arg-type]
                features=names,
                note=note,
                accelerators=_list(accelerators),
                tags=_list(tags),
            ),
            lambda v: change(name, "push", by, version=v.version),
        )

    @app.post(f"{API}/{{name}}/promote", tags=["models"], dependencies=guarded)
    async def promote(name: str, body: PromoteBody, request: Request) -> ModelView:
        manifest = await coordinator.change_catalog(
            lambda: store().promote(name, body.version, body.stage),
            lambda _: change(
                name, "promote", principal(request), version=body.version, stage=body.stage
            ),
        )
        return ModelView.of(manifest)

    @app.post(f"{API}/{{name}}/publish", tags=["models"], dependencies=guarded, status_code=202)
    async def request_publication(name: str, request: Request) -> PublicationRequested:
        """Ask every learn step publishing as ``name`` to push its models at its next batch."""
        asked = await coordinator.change_catalog(
            lambda: store().request_publication(name),
            lambda _: change(name, "publish", principal(request)),
        )
        return PublicationRequested(name=name, request=asked)

    @app.post(f"{API}/{{name}}/rollback", tags=["models"], dependencies=guarded)
    async def rollback(name: str, request: Request) -> ModelView:
        manifest = await coordinator.change_catalog(
            lambda: store().rollback(name),
            lambda m: change(name, "rollback", principal(request), version=m.production),
        )
        return ModelView.of(manifest)


def change(name: str, action: str, by: str, **fields: Any) -> dict[str, Any]:
    """The fields of a model's CatalogChanged record."""
    return {"catalog": "model", "name": name, "action": action, "by": by, **fields}
