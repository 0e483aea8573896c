"""Where a cluster's control data lives in NATS: KV buckets, log streams, subjects.

One module so the coordinator and the node agents can never disagree on a name.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

NODES_BUCKET = "spanflow_nodes"
PIPELINES_BUCKET = "spanflow_pipelines"
ASSIGNMENTS_BUCKET = "spanflow_assignments"
"""Keys ``<node>.<fragment id>``: a node agent watches ``<node>.>``."""
META_BUCKET = "spanflow_meta"
"""``topology`` (sites and links)."""
LEADER_BUCKET = "spanflow_leader"
"""``leader``: the coordinator holding the lease (it expires unless renewed)."""

WAL_STREAM = "SPANFLOW_WAL"
WAL_PREFIX = "spanflow.wal"
"""Control decisions, ``spanflow.wal.<kind>``; kept until an operator removes them."""

ACTIVITY_STREAM = "SPANFLOW_ACTIVITY"
ACTIVITY_PREFIX = "spanflow.activity"
"""Node reports, ``spanflow.activity.<node>.<fragment id>.<event>``."""
ACTIVITY_PER_SUBJECT = 200
ACTIVITY_MAX_AGE = 7 * 86400.0

HEARTBEAT_PREFIX = "spanflow.heartbeat"
"""Core NATS (not stored): ``spanflow.heartbeat.<node>``."""


def activity_subject(node: str, fragment_id: str, event: str) -> str:
    return f"{ACTIVITY_PREFIX}.{node}.{fragment_id}.{event}"


async def ensure_kv(
    js: JetStreamContext,
    bucket: str,
    *,
    history: int = 1,
    ttl: float | None = None,
    replicas: int = 1,
) -> KeyValue:
    """The key-value bucket, created on first use (``ttl``: seconds an entry lives;
    ``replicas``: copies on a clustered server, 3 to survive the loss of a server)."""
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        return await js.create_key_value(
            KeyValueConfig(
                bucket=bucket,
                history=history,
                ttl=ttl,
                storage=StorageType.FILE,
                replicas=replicas,
            )
        )


async def ensure_log_streams(js: JetStreamContext, replicas: int = 1) -> None:
    """The control log (unbounded) and the activity log (bounded per fragment and event)."""
    for config in (
        StreamConfig(
            name=WAL_STREAM,
            subjects=[f"{WAL_PREFIX}.>"],
            storage=StorageType.FILE,
            num_replicas=replicas,
        ),
        StreamConfig(
            name=ACTIVITY_STREAM,
            subjects=[f"{ACTIVITY_PREFIX}.>"],
            storage=StorageType.FILE,
            max_msgs_per_subject=ACTIVITY_PER_SUBJECT,
            max_age=ACTIVITY_MAX_AGE,
            num_replicas=replicas,
        ),
    ):
        try:
            await js.stream_info(config.name or "")
        except NotFoundError:
            await js.add_stream(config)


EDGE_ONLY_SUBJECTS = ("spanflow.cut.>", "spanflow.dlq.>")
"""Subjects a site with its own server keeps to itself (``deny_exports`` on its leaf
link): fragment outputs that cross sites travel by stream sourcing, not by subject
interest, and dead letters stay where they happened."""
