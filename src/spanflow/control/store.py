"""The coordinator's durable state: a write-ahead log in JetStream, state in JetStream KV.

Every control decision is a :class:`ControlRecord` carrying the KV writes it makes.
:meth:`ClusterStore.commit` appends the record to the log *first*, then applies its
writes, then records the log sequence it has applied. A coordinator that dies
between the two finds the record on restart (:meth:`ClusterStore.recover`) and applies
it again — the writes are plain puts and deletes, so applying twice is harmless. The
KV buckets are therefore always the log's result, and a coordinator started from
nothing but NATS has the same view as the one that died.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue
from pydantic import BaseModel, Field

from spanflow.nats.cluster import (
    ASSIGNMENTS_BUCKET,
    META_BUCKET,
    NODES_BUCKET,
    PIPELINES_BUCKET,
    WAL_PREFIX,
    WAL_STREAM,
    ensure_kv,
    ensure_log_streams,
)
from spanflow.nats.ranges import read_range
from spanflow.spec.cluster import now

log = logging.getLogger(__name__)

BUCKETS = (NODES_BUCKET, PIPELINES_BUCKET, ASSIGNMENTS_BUCKET, META_BUCKET)


class KVWrite(BaseModel):
    bucket: str
    key: str
    value: str | None = Field(description="JSON text; None deletes the key.")


class ControlRecord(BaseModel):
    """One control decision, as the log keeps it."""

    kind: str = Field(pattern=r"^[a-z][a-z-]*$")
    at: float = Field(default_factory=now)
    detail: dict[str, Any] = Field(default_factory=dict)
    writes: list[KVWrite] = Field(default_factory=list)


def put(bucket: str, key: str, model: BaseModel) -> KVWrite:
    return KVWrite(bucket=bucket, key=key, value=model.model_dump_json())


def delete(bucket: str, key: str) -> KVWrite:
    return KVWrite(bucket=bucket, key=key, value=None)


class ClusterStore:
    def __init__(self, nc: Client, buckets: dict[str, KeyValue]) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.buckets = buckets
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, nc: Client) -> ClusterStore:
        js = nc.jetstream()
        await ensure_log_streams(js)
        buckets = {name: await ensure_kv(js, name) for name in BUCKETS}
        return cls(nc, buckets)

    async def commit(self, record: ControlRecord) -> int:
        """Append to the log, then apply. Returns the record's log sequence."""
        async with self._lock:
            ack = await self.js.publish(
                f"{WAL_PREFIX}.{record.kind}", record.model_dump_json().encode()
            )
            await self._apply(ack.seq, record)
            return int(ack.seq)

    async def _apply(self, seq: int, record: ControlRecord) -> None:
        for w in record.writes:
            kv = self.buckets[w.bucket]
            if w.value is None:
                await kv.delete(w.key)
            else:
                await kv.put(w.key, w.value.encode())
        await self.buckets[META_BUCKET].put("applied", str(seq).encode())

    async def applied(self) -> int:
        try:
            entry = await self.buckets[META_BUCKET].get("applied")
        except KeyNotFoundError:
            return 0
        return int((entry.value or b"0").decode())

    async def recover(self) -> int:
        """Apply log records that were appended but not (known to be) applied."""
        async with self._lock:
            applied = await self.applied()
            info = await self.js.stream_info(WAL_STREAM)
            last = int(info.state.last_seq)
            if last <= applied:
                return 0
            messages = await read_range(self.nc, WAL_STREAM, applied + 1, last + 1)
            for m in messages:
                record = ControlRecord.model_validate_json(m.data)
                log.info("recovering log record %d (%s)", m.seq, record.kind)
                await self._apply(m.seq, record)
            return len(messages)

    async def load(self, bucket: str) -> dict[str, Any]:
        """Every key of a bucket with its JSON value decoded."""
        kv = self.buckets[bucket]
        try:
            keys = await kv.keys()
        except NoKeysError:
            return {}
        out: dict[str, Any] = {}
        for key in keys:
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                out[key] = orjson.loads(entry.value)
        return out

    async def history(self, after: int = 0, limit: int = 200) -> list[tuple[int, ControlRecord]]:
        """The last ``limit`` control records after sequence ``after`` (for the API)."""
        info = await self.js.stream_info(WAL_STREAM)
        last = int(info.state.last_seq)
        start = max(after + 1, last - limit + 1, int(info.state.first_seq))
        messages = await read_range(self.nc, WAL_STREAM, start, last + 1)
        return [(m.seq, ControlRecord.model_validate_json(m.data)) for m in messages]
