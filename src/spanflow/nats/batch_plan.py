"""Batch boundaries agreed by the replicas of a query (hot standby).

Two replicas of a fragment read the same stream on two nodes. Left alone, each cuts
its micro-batches where its own triggers fall, so batch 7 holds other rows on each
side: message ids (``pipeline:sink:batch:…``), Kafka's batch markers and PostgreSQL's
batch rows would all differ, and so would the watermark each batch leaves behind
(which decides whether a late row is dropped). Agreeing on every batch's end makes
the replicas' batches the same rows — so the same outputs, ids and late-row
decisions — whichever replica runs ahead.

The agreement is a key-value bucket (:data:`PLAN_BUCKET`) of the stream's server: the
first replica to plan a batch from a start sequence creates ``<prefix>.<start>`` with
its end (``create`` fails if the key exists, so exactly one proposal wins), and every
replica then uses that end. Entries live :data:`PLAN_TTL` seconds: a replica further
behind than that plans alone again.
"""

from __future__ import annotations

import re

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

    def agree(self, name: str, proposed: int) -> int:
        """The value every replica uses for ``name``: the first one proposed."""
        kv, key = self._bucket(), f"{self.prefix}.{name}"

        async def first() -> int:
            try:
                return int((await kv.get(key)).value or b"0")
            except KeyNotFoundError:
                pass
            try:
                await kv.create(key, str(proposed).encode())
                return proposed
            except KeyWrongLastSequenceError:  # another replica was first
                return int((await kv.get(key)).value or b"0")

        return self.client.run(first)

    def agreed(self, name: str) -> int | None:
        """The value agreed for ``name``, if any replica proposed one."""
        kv, key = self._bucket(), f"{self.prefix}.{name}"

        async def look() -> int | None:
            try:
                return int((await kv.get(key)).value or b"0")
            except KeyNotFoundError:
                return None

        return self.client.run(look)
