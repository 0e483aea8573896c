"""The model registry on JetStream: manifests in a key-value bucket, files in an
object store. A thin shell over the pure decisions of :mod:`spanflow.ml.registry`.

Every manifest change is a compare-and-set on the manifest's KV revision, retried
when someone else changed it first, so two pushes never get the same version number
and a promotion never overwrites a concurrent one. Files are stored under
``<name>/<version>`` before the manifest names them: a version in a manifest always
has its file.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from spanflow.errors import ModelError, ModelNotFound
from spanflow.ml import registry
from spanflow.ml.artifacts import LoadedModel, describe, load, sha256_of
from spanflow.ml.registry import Format, ModelManifest, ModelVersion, Stage
from spanflow.protocol.names import MODEL_FILES_BUCKET as FILES
from spanflow.protocol.names import MODEL_MANIFESTS_BUCKET as MANIFESTS
from spanflow.protocol.names import PUBLISH_REQUESTS_BUCKET as PUBLISH_REQUESTS
from spanflow.store.documents import Documents
from spanflow.store.files import Files
from spanflow.store.session import JetStream, with_jetstream
from spanflow.store.signals import Signals

MAX_FILE = 256 * 1024 * 1024
T = TypeVar("T")


@dataclass
class ModelStore:
    """The registry over one JetStream context."""

    js: JetStream

    def __post_init__(self) -> None:
        self.manifests = Documents(
            self.js,
            MANIFESTS,
            ModelManifest,
            missing=lambda name: ModelNotFound(f"no model {name!r} in the registry"),
            conflict=lambda name: ModelError(
                f"model {name!r} kept changing under this request; try again"
            ),
            check=registry.check_name,
        )
        self.files = Files(self.js, FILES)
        self.requests = Signals(self.js, PUBLISH_REQUESTS)

    async def manifest(self, name: str) -> tuple[ModelManifest, int]:
        """A model's manifest and its revision (ModelNotFound when unknown)."""
        return await self.manifests.get(name)

    async def names(self) -> list[str]:
        return await self.manifests.names()

    async def every(self, name: str | None = None) -> list[ModelManifest]:
        """Every model's manifest (``name``'s only, when given)."""
        return await self.manifests.every(name)

    async def request_publication(self, name: str) -> int:
        """Ask every learn step that publishes as ``name`` to publish its models at
        its next batch. The request's number (increasing)."""
        return await self.requests.raise_signal(registry.check_name(name))

    async def publication_request(self, name: str) -> int:
        """The number of the latest publish request for ``name`` (0: none)."""
        return await self.requests.latest(name)

    async def push(
        self,
        name: str,
        data: bytes,
        *,
        format: Format,
        features: Sequence[str],
        note: str = "",
        accelerators: Sequence[str] | None = None,
        tags: Sequence[str] | None = None,
    ) -> ModelVersion:
        """Store a model file as the next version of ``name`` (in staging);
        ``accelerators``/``tags``, when given, set what the model's nodes need."""
        registry.check_name(name)
        if len(data) > MAX_FILE:
            raise ModelError(f"model file is {len(data):,} bytes; at most {MAX_FILE:,}")
        inputs = describe(data, format, features)
        digest = sha256_of(data)
        # The file goes in under its digest first; the manifest names it by version.
        await self.files.put(f"{name}/sha256-{digest}", data)
        manifest = await self.manifests.change(
            name,
            lambda current: registry.add_version(
                current,
                name,
                sha256=digest,
                format=format,
                inputs=inputs,
                size=len(data),
                now=time.time(),
                note=note,
                accelerators=accelerators,
                tags=tags,
            ),
        )
        return manifest.versions[-1]

    async def promote(self, name: str, version: int, stage: Stage = "production") -> ModelManifest:
        return await self.manifests.change(
            name, lambda m: registry.promote(_known(m, name), version, stage)
        )

    async def rollback(self, name: str) -> ModelManifest:
        return await self.manifests.change(name, lambda m: registry.rollback(_known(m, name)))

    async def file(self, name: str, version: ModelVersion) -> bytes:
        data = await self.files.get(f"{name}/sha256-{version.sha256}")
        if data is None:
            raise ModelNotFound(f"the file of {name} version {version.version} is missing")
        return data

    async def load(self, name: str, version: ModelVersion) -> LoadedModel:
        """The version's file, verified against its sha256, loaded."""
        return load(version, await self.file(name, version))


def _known(manifest: ModelManifest | None, name: str) -> ModelManifest:
    if manifest is None:
        raise ModelNotFound(f"no model {name!r} in the registry")
    return manifest


async def with_store(url: str, work: Callable[[ModelStore], Awaitable[T]]) -> T:
    """Run ``work`` with a store over a fresh connection to ``url``."""
    return await with_jetstream(url, lambda js: work(ModelStore(js)))
