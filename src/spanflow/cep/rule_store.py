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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from nats.js.client import JetStreamContext
from nats.js.errors import (
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
)

from spanflow.cep import rules
from spanflow.cep.rules import RuleSetError, RuleSetManifest, RuleSetNotFound, RuleSetVersion
from spanflow.nats.cluster import ensure_kv
from spanflow.nats.manifests import change_manifest, read_manifest
from spanflow.nats.streams import connect, token
from spanflow.nats.sync import run_sync
from spanflow.protocol.names import RULE_MANIFESTS_BUCKET as MANIFESTS
from spanflow.protocol.names import RULE_PINS_BUCKET as PINS
from spanflow.spec.patterns import RuleSpec

PIN_TTL = 7 * 86400.0
START = "start"


@dataclass
class RuleStore:
    js: JetStreamContext

    async def _kv(self):  # type: ignore[no-untyped-def]
        return await ensure_kv(self.js, MANIFESTS, history=16)

    async def manifest(self, name: str) -> tuple[RuleSetManifest, int]:
        rules.check_name(name)
        found = await read_manifest(await self._kv(), name, RuleSetManifest)
        if found is None:
            raise RuleSetNotFound(f"no rule set {name!r}: push one (spanflow rules push)")
        return found

    async def names(self) -> list[str]:
        kv = await self._kv()
        try:
            return sorted(await kv.keys())
        except NoKeysError:
            return []

    async def _change(
        self, name: str, decide: Callable[[RuleSetManifest | None], RuleSetManifest]
    ) -> RuleSetManifest:
        return await change_manifest(
            await self._kv(),
            name,
            RuleSetManifest,
            decide,
            lambda: RuleSetError(f"rule set {name!r} kept changing under this request; try again"),
        )

    async def push(self, name: str, new: Sequence[RuleSpec], note: str = "") -> RuleSetVersion:
        manifest = await self._change(
            name, lambda m: rules.push(m, name, new, now=time.time(), note=note)
        )
        assert manifest.current is not None
        return manifest.version(manifest.current)

    async def rollback(self, name: str) -> RuleSetManifest:
        return await self._change(name, lambda m: rules.rollback(_known(m, name)))

    async def current(self, name: str) -> RuleSetVersion:
        manifest, _ = await self.manifest(name)
        if manifest.current is None:
            raise RuleSetNotFound(f"rule set {name!r} has no current version")
        return manifest.version(manifest.current)

    async def pinned(self, name: str, pin_key: str) -> RuleSetVersion:
        """The version batch ``pin_key`` uses: pinned by the first task that asks."""
        pins = await _pins(self.js)
        try:
            entry = await pins.get(pin_key)
            number = orjson.loads(entry.value or b"{}")["version"]
        except (KeyNotFoundError, KeyError):
            chosen = await self.current(name)
            try:
                await pins.create(pin_key, orjson.dumps({"version": chosen.version}))
                return chosen
            except KeyWrongLastSequenceError:
                entry = await pins.get(pin_key)
                number = orjson.loads(entry.value or b"{}")["version"]
        manifest, _ = await self.manifest(name)
        return manifest.version(number)


def _known(manifest: RuleSetManifest | None, name: str) -> RuleSetManifest:
    if manifest is None:
        raise RuleSetNotFound(f"no rule set {name!r}: push one (spanflow rules push)")
    return manifest


async def _pins(js: JetStreamContext) -> Any:
    return await ensure_kv(js, PINS, ttl=PIN_TTL)


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

    async def go() -> RuleSetVersion:
        nc = await connect(url)
        try:
            store = RuleStore(nc.jetstream())
            return await (store.pinned(name, key) if key is not None else store.current(name))
        finally:
            await nc.close()

    chosen = run_sync(go())
    with _lock:
        if len(_versions) > 1000:
            _versions.clear()
        _versions[cache_key] = chosen
    return chosen


async def with_store(url: str, work: Callable[[RuleStore], Any]) -> Any:
    nc = await connect(url)
    try:
        return await work(RuleStore(nc.jetstream()))
    finally:
        await nc.close()
