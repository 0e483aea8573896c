"""Files by name in a JetStream object store (model artifacts)."""

from __future__ import annotations

from dataclasses import dataclass

from nats.js.errors import NotFoundError

from spanflow.nats.cluster import ensure_object_store
from spanflow.store.session import JetStream


@dataclass(frozen=True)
class Files:
    js: JetStream
    bucket: str

    async def put(self, name: str, data: bytes) -> None:
        await (await ensure_object_store(self.js, self.bucket)).put(name, data)

    async def get(self, name: str) -> bytes | None:
        """The file's bytes (None when there is no such file)."""
        files = await ensure_object_store(self.js, self.bucket)
        try:
            result = await files.get(name)
        except NotFoundError:
            return None
        return bytes(result.data or b"")
