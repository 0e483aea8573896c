"""Model needs of a pipeline: the one room that reads the model registry (NATS).

A score step runs only on nodes that have what its model needs (accelerators, tags)
as the registry declares; a model not in the registry is refused at submission rather
than failing the query where it is placed.
"""

from __future__ import annotations

from nats.aio.client import Client

from spanflow.control.errors import Invalid, Unavailable
from spanflow.errors import ModelNotFound
from spanflow.ml.model_store import ModelStore
from spanflow.ml.registry import ModelManifest, pin_to_model_needs, scored_models
from spanflow.spec.pipeline import PipelineSpec


async def with_model_needs(nc: Client | None, spec: PipelineSpec) -> PipelineSpec:
    names = scored_models(spec)
    if not names:
        return spec
    if nc is None:
        raise Unavailable("not_connected", "the coordinator is not connected to NATS yet")
    store = ModelStore(nc.jetstream())
    manifests: dict[str, ModelManifest] = {}
    for name in names:
        try:
            manifests[name], _ = await store.manifest(name)
        except ModelNotFound:
            raise Invalid(
                "unknown_model",
                f"pipeline {spec.name!r} scores with model {name!r}, which is not in "
                "the registry: push it first (spanflow model push)",
            ) from None
    return pin_to_model_needs(spec, manifests)
