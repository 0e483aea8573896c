"""Documents in a JetStream key-value bucket changed by compare-and-set: read the
value and its revision, decide the new value, write it only if nobody wrote in
between — else decide again on what they wrote. The model registry and rule sets
keep their manifests this way, so concurrent pushes never share a version number."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from pydantic import BaseModel

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
