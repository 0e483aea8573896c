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
from spanflow.ml.registry import Stage
from spanflow.server.errors import RequestError

API = "/api/v1/models"


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
    async def list_models() -> list[dict[str, Any]]:
        models = store()
        out = []
        for name in await models.names():
            manifest, _ = await models.manifest(name)
            out.append(manifest.model_dump(mode="json") | {"production": manifest.production})
        return out

    @app.get(f"{API}/{{name}}", tags=["models"], dependencies=guarded)
    async def get_model(name: str) -> dict[str, Any]:
        manifest, _ = await store().manifest(name)
        return manifest.model_dump(mode="json") | {"production": manifest.production}

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
    ) -> dict[str, Any]:
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
        return dict(version.model_dump(mode="json"))

    @app.post(f"{API}/{{name}}/promote", tags=["models"], dependencies=guarded)
    async def promote(name: str, body: PromoteBody) -> dict[str, Any]:
        manifest = await store().promote(name, body.version, body.stage)
        return manifest.model_dump(mode="json") | {"production": manifest.production}

    @app.post(f"{API}/{{name}}/publish", tags=["models"], dependencies=guarded, status_code=202)
    async def request_publication(name: str) -> dict[str, Any]:
        """Ask every learn step publishing as ``name`` to push its models at its next batch."""
        return {"name": name, "request": await store().request_publication(name)}

    @app.post(f"{API}/{{name}}/rollback", tags=["models"], dependencies=guarded)
    async def rollback(name: str) -> dict[str, Any]:
        manifest = await store().rollback(name)
        return manifest.model_dump(mode="json") | {"production": manifest.production}
