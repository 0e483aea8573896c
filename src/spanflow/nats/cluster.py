"""Where a cluster's control data lives in NATS: creating and opening its KV buckets,
log streams and object stores. Their names are in :mod:`spanflow.protocol.names` (one
module, so the coordinator and the node agents can never disagree on a name); they are
re-exported here for the modules that open them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import orjson
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    NotFoundError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from spanflow.protocol.names import ACTIVITY_PREFIX as ACTIVITY_PREFIX
from spanflow.protocol.names import ACTIVITY_STREAM as ACTIVITY_STREAM
from spanflow.protocol.names import ASSIGNMENTS_BUCKET as ASSIGNMENTS_BUCKET
from spanflow.protocol.names import EDGE_ONLY_SUBJECTS as EDGE_ONLY_SUBJECTS
from spanflow.protocol.names import HEARTBEAT_PREFIX as HEARTBEAT_PREFIX
from spanflow.protocol.names import LEADER_BUCKET as LEADER_BUCKET
from spanflow.protocol.names import META_BUCKET as META_BUCKET
from spanflow.protocol.names import NODES_BUCKET as NODES_BUCKET
from spanflow.protocol.names import PIPELINES_BUCKET as PIPELINES_BUCKET
from spanflow.protocol.names import WAL_PREFIX as WAL_PREFIX
from spanflow.protocol.names import WAL_STREAM as WAL_STREAM

log = logging.getLogger(__name__)
T = TypeVar("T")

ACTIVITY_PER_SUBJECT = 200
ACTIVITY_MAX_AGE = 7 * 86400.0


def activity_subject(node: str, fragment_id: str, event: str) -> str:
    return f"{ACTIVITY_PREFIX}.{node}.{fragment_id}.{event}"


MAX_AUTO_REPLICAS = 3
"""Copies spanflow asks for when none are configured: one per server of the cluster,
up to three (R3 survives the loss of any one server; more only slows writes)."""


def cluster_servers(nc: Client) -> int:
    """Servers in the NATS cluster ``nc`` is connected to, as its INFO announced them
    (1 for a server that is not clustered, such as a site's leaf server)."""
    info: dict[str, Any] = getattr(nc, "_server_info", None) or {}
    if not info.get("cluster"):
        return 1
    return max(1, len(set(info.get("connect_urls") or ())))


def auto_replicas(js: JetStreamContext) -> int:
    """How many copies a stream or bucket gets on the server ``js`` talks to when no
    count is configured: one per server of its cluster, up to :data:`MAX_AUTO_REPLICAS`."""
    nc = getattr(js, "_nc", None)
    return min(MAX_AUTO_REPLICAS, cluster_servers(nc)) if nc is not None else 1


async def resolve_replicas(js: JetStreamContext, replicas: int | None) -> int:
    return replicas if replicas else auto_replicas(js)


async def raise_replicas(js: JetStreamContext, stream: str, replicas: int) -> None:
    """Give an existing stream (a bucket's or object store's too) at least ``replicas``
    copies: state made by an older version, or before the cluster grew, is never left
    single-copy. Never lowers a count; a cluster that cannot place the copies now
    (a server down) is tried again at the next start."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return
    if (info.config.num_replicas or 1) >= replicas:
        return
    try:
        await js.update_stream(replace(info.config, num_replicas=replicas))
        log.info("stream %s: now %d copies", stream, replicas)
    except APIError as exc:
        log.warning("stream %s: cannot raise to %d copies now: %s", stream, replicas, exc)


async def get_json(kv: KeyValue, key: str) -> Any:
    """The JSON value of ``key`` in ``kv`` (None when absent or empty)."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return orjson.loads(entry.value) if entry.value else None


async def ensure_kv(
    js: JetStreamContext,
    bucket: str,
    *,
    history: int = 1,
    ttl: float | None = None,
    replicas: int | None = None,
) -> KeyValue:
    """The key-value bucket, created on first use (``ttl``: seconds an entry lives;
    ``replicas``: copies, by default one per server of the cluster up to three; an
    existing bucket with fewer is raised to it)."""
    copies = await resolve_replicas(js, replicas)
    config = KeyValueConfig(
        bucket=bucket, history=history, ttl=ttl, storage=StorageType.FILE, replicas=copies
    )
    return await _open_or_create(
        lambda: js.key_value(bucket),
        lambda: js.create_key_value(config),
        js,
        f"KV_{bucket}",
        copies,
    )


async def ensure_object_store(
    js: JetStreamContext, bucket: str, *, replicas: int | None = None
) -> ObjectStore:
    """The object store, created on first use with ``replicas`` copies (as
    :func:`ensure_kv`)."""
    copies = await resolve_replicas(js, replicas)
    config = ObjectStoreConfig(bucket=bucket, replicas=copies)
    return await _open_or_create(
        lambda: js.object_store(bucket),
        lambda: js.create_object_store(bucket, config),
        js,
        f"OBJ_{bucket}",
        copies,
    )


async def _open_or_create(
    opening: Callable[[], Awaitable[T]],
    creating: Callable[[], Awaitable[T]],
    js: JetStreamContext,
    stream: str,
    copies: int,
) -> T:
    """A bucket opened, or created when missing. A refused create is another process's
    create winning the race (open what it made), or a real refusal (e.g. a cluster that
    cannot place the copies now), raised. An existing bucket gets its copies raised."""
    try:
        found = await opening()
    except BucketNotFoundError:
        try:
            return await creating()
        except APIError as refused:
            try:
                return await opening()
            except BucketNotFoundError:
                raise refused from None
    if copies > 1:
        await raise_replicas(js, stream, copies)
    return found


async def ensure_log_streams(
    js: JetStreamContext,
    replicas: int | None = None,
    *,
    activity_js: JetStreamContext | None = None,
) -> None:
    """The control log (in ``js``: the control account when locked) and the activity
    log the agents report to (in ``activity_js``, their account; default ``js``),
    bounded per fragment and event."""
    replicas = await resolve_replicas(js, replicas)
    control = StreamConfig(
        name=WAL_STREAM,
        subjects=[f"{WAL_PREFIX}.>"],
        storage=StorageType.FILE,
        num_replicas=replicas,
    )
    activity = StreamConfig(
        name=ACTIVITY_STREAM,
        subjects=[f"{ACTIVITY_PREFIX}.>"],
        storage=StorageType.FILE,
        max_msgs_per_subject=ACTIVITY_PER_SUBJECT,
        max_age=ACTIVITY_MAX_AGE,
        num_replicas=replicas,
    )
    for where, config in ((js, control), (activity_js or js, activity)):
        try:
            await where.stream_info(config.name or "")
        except NotFoundError:
            with contextlib.suppress(BadRequestError):  # created meanwhile
                await where.add_stream(config)
        await raise_replicas(where, config.name or "", replicas)
