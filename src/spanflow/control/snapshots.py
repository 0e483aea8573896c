"""Snapshots of the cluster state: what keeps the control log bounded.

The state is a fold of the log (:func:`spanflow.control.state.apply`), so the state
after record ``S`` *is* everything records ``1..S`` said. A snapshot is that state,
written with ``S``; recovery loads the latest snapshot and replays only the records
after it, and records older than the snapshot (less a tail kept for the API's
history, :data:`KEEP_TAIL`) are purged. Only the leader writes snapshots, every
:data:`SNAPSHOT_EVERY` records; a standby that fell behind the purge reloads from it.

Pure: encoding and decoding only; :class:`spanflow.control.log.ControlLog` stores them.
"""

from __future__ import annotations

import zlib

from pydantic import BaseModel, Field

from spanflow.control.state import ClusterState
from spanflow.spec.cluster import Assignment, NodeRecord, PipelineRecord
from spanflow.spec.topology import Topology

SNAPSHOT_EVERY = 5_000
"""Records between two snapshots: recovery replays at most this many (plus the tail)."""
KEEP_TAIL = 1_000
"""Records kept before the latest snapshot, for ``/api/v1/cluster/log``."""
FORMAT = 1


class Snapshot(BaseModel):
    """The state after log record ``applied``."""

    format: int = FORMAT
    applied: int = Field(description="Sequence of the last record the state includes.")
    topology: Topology
    nodes: dict[str, NodeRecord]
    pipelines: dict[str, PipelineRecord]
    assignments: dict[str, Assignment]
    moved_at: dict[str, float]
    leader: str | None
    leader_epoch: int


def encode(state: ClusterState) -> bytes:
    """The state as a compressed snapshot."""
    fields = {name: getattr(state, name) for name in ClusterState.__dataclass_fields__}
    return zlib.compress(Snapshot(**fields).model_dump_json().encode(), 6)


def decode(data: bytes) -> ClusterState:
    """The state a snapshot holds (ValueError: not a snapshot this version reads)."""
    try:
        snapshot = Snapshot.model_validate_json(zlib.decompress(data))
    except zlib.error as exc:
        raise ValueError(f"not a snapshot: {exc}") from None
    if snapshot.format != FORMAT:
        raise ValueError(f"snapshot format {snapshot.format}, this version reads {FORMAT}")
    return ClusterState(
        **{name: getattr(snapshot, name) for name in ClusterState.__dataclass_fields__}
    )


def purge_below(snapshot_applied: int) -> int:
    """The first log sequence to keep once a snapshot at ``snapshot_applied`` is
    stored (everything before it may go)."""
    return max(1, snapshot_applied - KEEP_TAIL + 1)


def due(applied: int, last_snapshot: int) -> bool:
    """Whether the leader should write a snapshot now."""
    return applied - last_snapshot >= SNAPSHOT_EVERY
