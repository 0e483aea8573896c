"""Batch boundaries agreed by the replicas of a query (hot standby).

Two replicas of a fragment read the same stream on two nodes. Left alone, each cuts
its micro-batches where its own triggers fall, so batch 7 holds other rows on each
side: message ids (``pipeline:sink:batch:…``), Kafka's batch markers and PostgreSQL's
batch rows would all differ, and so would the watermark each batch leaves behind
(which decides whether a late row is dropped). Agreeing on every batch's end makes
the replicas' batches the same rows — so the same outputs, ids and late-row
decisions — whichever replica runs ahead.

The agreement is a key-value bucket (:data:`PLAN_BUCKET`) of the stream's server: the
first replica to plan a batch from a start offset creates ``<prefix>.<start>`` with
its end offset (``create`` fails if the key exists, so exactly one proposal wins), and
every replica then uses that end. Entries live :data:`PLAN_TTL` seconds: a replica
further behind than that plans alone again. Values are JSON.

An idle stream is planned too: a replica that finds nothing new for a trigger interval
proposes one empty batch (an *idle tick*, the source's heartbeat batch), so windows the
last data passed are emitted as Spark's no-data batches would — those run when each
replica's own timing says and are turned off under a plan.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from spanflow.nats.cluster import ensure_kv
from spanflow.nats.streams import SyncNats

PLAN_BUCKET = "spanflow_batch_plans"
PLAN_TTL = 3600.0
"""Seconds a batch's agreed end is kept."""


def plan_key(*parts: str) -> str:
    """A key from names (fragment, sink, source step): characters a key may not hold
    become ``_``, and each name stays one token."""
    return ".".join(re.sub(r"[^A-Za-z0-9_=-]", "_", p) for p in parts)


class BatchPlan:
    """The agreed ends of one query's batches (driver side, blocking)."""

    def __init__(self, client: SyncNats, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._kv: KeyValue | None = None

    def _bucket(self) -> KeyValue:
        if self._kv is None:
            js = self.client.js
            self._kv = self.client.run(lambda: ensure_kv(js, PLAN_BUCKET, ttl=PLAN_TTL))
        return self._kv

    def agree(self, name: str, proposed: Any) -> Any:
        """The value every replica uses for ``name``: the first one proposed."""
        kv, key = self._bucket(), f"{self.prefix}.{name}"

        async def first() -> Any:
            found = await _read(kv, key)
            if found is not None:
                return found
            try:
                await kv.create(key, orjson.dumps(proposed))
                return proposed
            except KeyWrongLastSequenceError:  # another replica was first
                return await _read(kv, key)

        return self.client.run(first)

    def agreed(self, name: str) -> Any | None:
        """The value agreed for ``name``, if any replica proposed one."""
        kv, key = self._bucket(), f"{self.prefix}.{name}"
        return self.client.run(lambda: _read(kv, key))


async def _read(kv: KeyValue, key: str) -> Any | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return orjson.loads(entry.value) if entry.value else None
