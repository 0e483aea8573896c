"""Rule sets on JetStream, and the version a pattern step uses for a micro-batch.

Manifests live in the ``SPANFLOW_RULES`` key-value bucket, changed by compare-and-set
on their revision (concurrent pushes get distinct versions). A running pattern step
pins one version per micro-batch in ``SPANFLOW_RULE_PINS`` (``create`` on
``<pipeline>.<step>.<batch>``: the first task of the batch decides, every other task
and a replay of the batch read it), so a push applies at the next batch boundary and
a replayed batch matches with the rules it first ran with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from spanflow.cep import rules
from spanflow.cep.rules import RuleSetError, RuleSetManifest, RuleSetNotFound, RuleSetVersion
from spanflow.protocol.names import RULE_MANIFESTS_BUCKET as MANIFESTS
from spanflow.protocol.names import RULE_PINS_BUCKET as PINS
from spanflow.protocol.names import token
from spanflow.spec.patterns import RuleSpec
from spanflow.store.documents import Documents
from spanflow.store.pins import Pins
from spanflow.store.session import JetStream, run_with_jetstream, with_jetstream

T = TypeVar("T")


@dataclass
class RuleStore:
    js: JetStream

    def __post_init__(self) -> None:
        self.manifests = Documents(
            self.js,
            MANIFESTS,
            RuleSetManifest,
            missing=lambda name: RuleSetNotFound(
                f"no rule set {name!r}: push one (spanflow rules push)"
            ),
            conflict=lambda name: RuleSetError(
                f"rule set {name!r} kept changing under this request; try again"
            ),
            check=rules.check_name,
        )

    async def manifest(self, name: str) -> tuple[RuleSetManifest, int]:
        """A rule set's manifest and its revision (RuleSetNotFound when unknown)."""
        return await self.manifests.get(name)

    async def names(self) -> list[str]:
        return await self.manifests.names()

    async def every(self, name: str | None = None) -> list[RuleSetManifest]:
        """Every rule set's manifest (``name``'s only, when given)."""
        return await self.manifests.every(name)

    async def push(self, name: str, new: Sequence[RuleSpec], note: str = "") -> RuleSetVersion:
        manifest = await self.manifests.change(
            name, lambda m: rules.push(m, name, new, now=time.time(), note=note)
        )
        assert manifest.current is not None
        return manifest.version(manifest.current)

    async def rollback(self, name: str) -> RuleSetManifest:
        return await self.manifests.change(name, lambda m: rules.rollback(_known(m, name)))

    async def current(self, name: str) -> RuleSetVersion:
        manifest, _ = await self.manifest(name)
        if manifest.current is None:
            raise RuleSetNotFound(f"rule set {name!r} has no current version")
        return manifest.version(manifest.current)

    async def pinned(self, name: str, pin_key: str) -> RuleSetVersion:
        """The version batch ``pin_key`` uses: pinned by the first task that asks."""

        async def current() -> dict[str, int]:
            return {"version": (await self.current(name)).version}

        pin = await Pins(self.js, PINS).pinned(pin_key, current)
        manifest, _ = await self.manifest(name)
        return manifest.version(pin["version"])


def _known(manifest: RuleSetManifest | None, name: str) -> RuleSetManifest:
    if manifest is None:
        raise RuleSetNotFound(f"no rule set {name!r}: push one (spanflow rules push)")
    return manifest


def pin_key(pipeline: str, step: str, batch: str) -> str:
    return f"{token(f'{pipeline}.{step}')}.{batch}"


_versions: dict[tuple[str, str, str], RuleSetVersion] = {}
_lock = threading.Lock()


def version_for_batch(
    url: str, name: str, pipeline: str, step: str, batch: str | None
) -> RuleSetVersion:
    """The rule-set version micro-batch ``batch`` of a step runs (see the module doc),
    cached per worker process; without a batch (outside Spark), the current one."""
    key = pin_key(pipeline, step, batch) if batch is not None else None
    cache_key = (url, key or "", name)
    with _lock:
        cached = _versions.get(cache_key) if key is not None else None
    if cached is not None:
        return cached

    async def choose(js: JetStream) -> RuleSetVersion:
        store = RuleStore(js)
        return await (store.pinned(name, key) if key is not None else store.current(name))

    chosen = run_with_jetstream(url, choose)
    with _lock:
        if len(_versions) > 1000:
            _versions.clear()
        _versions[cache_key] = chosen
    return chosen


async def with_store(url: str, work: Callable[[RuleStore], Awaitable[T]]) -> T:
    """Run ``work`` with a store over a fresh connection to ``url``."""
    return await with_jetstream(url, lambda js: work(RuleStore(js)))
