"""REST endpoints of the model registry (``/api/v1/models``), token-protected like the
rest of the API. A model file is uploaded as the raw request body; a River model is
a pickle, i.e. code, so the upload is accepted only from a caller holding the token
(see docs/ml.md, "the trust boundary")."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, Field

from spanflow.control.coordinator import Coordinator
from spanflow.control.errors import Unavailable
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


def add_model_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    def store() -> ModelStore:
        if coordinator.nc is None:
            raise Unavailable("not_connected", "the coordinator is not connected to NATS yet")
        return ModelStore(coordinator.nc.jetstream())

    @app.get(API, tags=["models"], dependencies=guarded)
    async def list_models() -> list[ModelView]:
        models = store()
        out = []
        for name in await models.names():
            manifest, _ = await models.manifest(name)
            out.append(ModelView.of(manifest))
        return out

    @app.get(f"{API}/{{name}}", tags=["models"], dependencies=guarded)
    async def get_model(name: str) -> ModelView:
        manifest, _ = await store().manifest(name)
        return ModelView.of(manifest)

    @app.post(f"{API}/{{name}}/versions", tags=["models"], dependencies=guarded, status_code=201)
    async def push(
        name: str,
        request: Request,
        format: Annotated[str, Query(pattern="^(onnx|river)$")],
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
        version = await store().push(
            name,
            data,
            format=format,  # type: ignore[arg-type]
            features=names,
            note=note,
            accelerators=_list(accelerators),
            tags=_list(tags),
        )
        return version

    @app.post(f"{API}/{{name}}/promote", tags=["models"], dependencies=guarded)
    async def promote(name: str, body: PromoteBody) -> ModelView:
        manifest = await store().promote(name, body.version, body.stage)
        return ModelView.of(manifest)

    @app.post(f"{API}/{{name}}/publish", tags=["models"], dependencies=guarded, status_code=202)
    async def request_publication(name: str) -> PublicationRequested:
        """Ask every learn step publishing as ``name`` to push its models at its next batch."""
        return PublicationRequested(name=name, request=await store().request_publication(name))

    @app.post(f"{API}/{{name}}/rollback", tags=["models"], dependencies=guarded)
    async def rollback(name: str) -> ModelView:
        manifest = await store().rollback(name)
        return ModelView.of(manifest)
