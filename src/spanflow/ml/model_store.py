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

from nats.js.client import JetStreamContext
from nats.js.errors import (
    KeyNotFoundError,
    NoKeysError,
)
from nats.js.errors import NotFoundError as ObjectNotFoundError

from spanflow.errors import ModelError, ModelNotFound
from spanflow.ml import registry
from spanflow.ml.artifacts import LoadedModel, describe, load, sha256_of
from spanflow.ml.registry import Format, ModelManifest, ModelVersion, Stage
from spanflow.nats.cluster import ensure_kv, ensure_object_store
from spanflow.nats.manifests import change_manifest, read_manifest
from spanflow.protocol.names import MODEL_FILES_BUCKET as FILES
from spanflow.protocol.names import MODEL_MANIFESTS_BUCKET as MANIFESTS
from spanflow.protocol.names import PUBLISH_REQUESTS_BUCKET as PUBLISH_REQUESTS

MAX_FILE = 256 * 1024 * 1024


@dataclass
class ModelStore:
    """The registry over one JetStream context."""

    js: JetStreamContext

    async def _kv(self):  # type: ignore[no-untyped-def]
        return await ensure_kv(self.js, MANIFESTS, history=16)

    async def _files(self):  # type: ignore[no-untyped-def]
        return await ensure_object_store(self.js, FILES)

    async def _requests(self):  # type: ignore[no-untyped-def]
        return await ensure_kv(self.js, PUBLISH_REQUESTS)

    async def request_publication(self, name: str) -> int:
        """Ask every learn step that publishes as ``name`` to publish its models at
        its next batch. The request's number (a KV revision, increasing)."""
        registry.check_name(name)
        kv = await self._requests()
        return int(await kv.put(name, str(time.time()).encode()))

    async def publication_request(self, name: str) -> int:
        """The number of the latest publish request for ``name`` (0: none)."""
        kv = await self._requests()
        try:
            entry = await kv.get(name)
        except KeyNotFoundError:
            return 0
        return entry.revision or 0

    async def manifest(self, name: str) -> tuple[ModelManifest, int]:
        """A model's manifest and its KV revision (ModelNotFound when unknown)."""
        registry.check_name(name)
        found = await read_manifest(await self._kv(), name, ModelManifest)
        if found is None:
            raise ModelNotFound(f"no model {name!r} in the registry")
        return found

    async def names(self) -> list[str]:
        kv = await self._kv()
        try:
            return sorted(await kv.keys())
        except NoKeysError:
            return []

    async def _change(
        self, name: str, change: Callable[[ModelManifest | None], ModelManifest]
    ) -> ModelManifest:
        return await change_manifest(
            await self._kv(),
            name,
            ModelManifest,
            change,
            lambda: ModelError(f"model {name!r} kept changing under this request; try again"),
        )

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
        files = await self._files()
        # The file goes in under its digest first; the manifest names it by version.
        await files.put(f"{name}/sha256-{digest}", data)
        manifest = await self._change(
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
        return await self._change(name, lambda m: registry.promote(_known(m, name), version, stage))

    async def rollback(self, name: str) -> ModelManifest:
        return await self._change(name, lambda m: registry.rollback(_known(m, name)))

    async def file(self, name: str, version: ModelVersion) -> bytes:
        files = await self._files()
        try:
            result = await files.get(f"{name}/sha256-{version.sha256}")
        except ObjectNotFoundError:
            raise ModelNotFound(
                f"the file of {name} version {version.version} is missing"
            ) from None
        return bytes(result.data or b"")

    async def load(self, name: str, version: ModelVersion) -> LoadedModel:
        """The version's file, verified against its sha256, loaded."""
        return load(version, await self.file(name, version))


def _known(manifest: ModelManifest | None, name: str) -> ModelManifest:
    if manifest is None:
        raise ModelNotFound(f"no model {name!r} in the registry")
    return manifest


async def with_store(url: str, work: Callable[[ModelStore], Awaitable[object]]) -> object:
    """Run ``work`` with a store over a fresh connection to ``url``."""
    from spanflow.nats.streams import connect

    nc = await connect(url)
    try:
        return await work(ModelStore(nc.jetstream()))
    finally:
        await nc.close()
