"""Documents in a JetStream key-value bucket changed by compare-and-set: read the
value and its revision, decide the new value, write it only if nobody wrote in
between — else decide again on what they wrote. The model registry and rule sets
keep their manifests this way, so concurrent pushes never share a version number."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
)
from pydantic import BaseModel

from spanflow.nats.cluster import ensure_kv, get_json
from spanflow.store.session import JetStream

M = TypeVar("M", bound=BaseModel)
ATTEMPTS = 20


async def read_manifest(kv: Any, key: str, model: type[M]) -> tuple[M, int] | None:
    """The document at ``key`` and its revision (None when there is none)."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    if entry.value is None:
        return None
    return model.model_validate_json(entry.value), entry.revision or 0


async def change_manifest(
    kv: Any,
    key: str,
    model: type[M],
    decide: Callable[[M | None], M],
    conflict: Callable[[], Exception],
) -> M:
    """Write ``decide(current)`` at ``key`` by compare-and-set, retrying on a
    concurrent change; ``conflict()`` is raised when it keeps changing."""
    for _ in range(ATTEMPTS):
        found = await read_manifest(kv, key, model)
        current, revision = found if found is not None else (None, 0)
        updated = decide(current)
        data = updated.model_dump_json().encode()
        try:
            if revision:
                await kv.update(key, data, last=revision)
            else:
                await kv.create(key, data)
            return updated
        except KeyWrongLastSequenceError:
            continue  # changed (or created) meanwhile: decide again on theirs
    raise conflict()


def _as_is(name: str) -> str:
    return name


@dataclass
class Documents(Generic[M]):
    """The documents of one kind (``model``) in one bucket, by name: a catalog of
    manifests. ``missing(name)`` is raised for an unknown name, ``conflict(name)``
    when a change keeps losing its compare-and-set; ``check(name)`` vets a name.
    The bucket is opened once per instance (a store lives as long as its JetStream
    context)."""

    js: JetStream
    bucket: str
    model: type[M]
    missing: Callable[[str], Exception]
    conflict: Callable[[str], Exception]
    check: Callable[[str], str] = _as_is
    history: int = 16
    _opened: Any = field(default=None, init=False, repr=False, compare=False)

    async def _kv(self) -> Any:
        """The bucket, opened (or made) on first use and kept for this instance."""
        if self._opened is None:
            self._opened = await ensure_kv(self.js, self.bucket, history=self.history)
        return self._opened

    async def get(self, name: str) -> tuple[M, int]:
        """The document ``name`` and its revision."""
        found = await read_manifest(await self._kv(), self.check(name), self.model)
        if found is None:
            raise self.missing(name)
        return found

    async def names(self) -> list[str]:
        kv = await self._kv()
        try:
            return sorted(await kv.keys())
        except NoKeysError:
            return []

    async def every(self, name: str | None = None) -> list[M]:
        """Every document, by name (``name``'s only, when given)."""
        names = [name] if name is not None else await self.names()
        return [(await self.get(n))[0] for n in names]

    async def change(self, name: str, decide: Callable[[M | None], M]) -> M:
        """:func:`change_manifest` on document ``name``."""
        kv = await self._kv()
        return await change_manifest(
            kv, self.check(name), self.model, decide, lambda: self.conflict(name)
        )


async def read_json(js: JetStream, bucket: str, key: str) -> Any:
    """The JSON value at ``key`` of a bucket someone else keeps (None when the bucket
    or the key is not there: nothing was written yet)."""
    try:
        kv = await js.key_value(bucket)
    except BucketNotFoundError:
        return None
    return await get_json(kv, key)
