"""Per-batch choices that hold on replay: the first task of a micro-batch to ask
decides (``create`` on the batch's key, which only the first writer wins); every
other task, and the same batch replayed after a crash, reads what it decided.

Score steps pin a model version per stage, pattern steps a rule-set version,
detectors the generations of their rebaselines (spanflow.ml.scoring,
spanflow.cep.rule_store, spanflow.ml.rebaseline).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from nats.js.errors import KeyWrongLastSequenceError

from spanflow.nats.cluster import ensure_kv, get_json
from spanflow.store.session import JetStream

PIN_TTL = 7 * 86400.0
"""Pins outlive any replay a checkpoint can ask for, then expire."""


@dataclass
class Pins:
    """The pins of one bucket; the bucket is opened (or made) once per instance, since
    score and pattern steps ask for a pin on every micro-batch."""

    js: JetStream
    bucket: str
    _opened: Any = field(default=None, init=False, repr=False, compare=False)

    async def _kv(self) -> Any:
        if self._opened is None:
            self._opened = await ensure_kv(self.js, self.bucket, ttl=PIN_TTL)
        return self._opened

    async def get(self, key: str) -> Any:
        """The JSON value at ``key`` (None when nothing is pinned there)."""
        return await get_json(await self._kv(), key)

    async def put(self, key: str, value: Any) -> None:
        """Overwrite ``key`` (for bookkeeping beside the pins: the last choice, a
        rejection's reason)."""
        await (await self._kv()).put(key, orjson.dumps(value))

    async def first(self, key: str, value: Any) -> tuple[Any, bool]:
        """Pin ``value`` at ``key`` unless a pin is there: (what is pinned, whether
        this call pinned it)."""
        try:
            await (await self._kv()).create(key, orjson.dumps(value))
        except KeyWrongLastSequenceError:
            theirs = await self.get(key)
            return (value if theirs is None else theirs), False
        return value, True

    async def pinned(self, key: str, choose: Callable[[], Awaitable[Any]]) -> Any:
        """What ``key`` pins, chosen by ``choose()`` when nobody pinned it yet."""
        found = await self.get(key)
        if found is not None:
            return found
        chosen, _ = await self.first(key, await choose())
        return chosen
