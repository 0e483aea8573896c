"""The control log: append → apply → project.

Every decision is a typed record (:mod:`spanflow.control.records`) appended to the
``SPANFLOW_WAL`` stream *before* it changes anything. :meth:`ControlLog.commit`
appends with the sequence it expects to follow (JetStream's expected-last-sequence):
if any other writer appended in between — a second coordinator that believes it
leads — the append is refused and nothing changes. Then the record is applied to the
state (:func:`spanflow.control.state.apply`, the only writer) and the KV buckets the
agents watch are brought in line with the state (the *projection*: nodes, pipelines,
assignments, topology).

Recovery (:meth:`ControlLog.recover`) folds the whole log through the same ``apply``
and repairs the projection key by key, so a coordinator that died between appending
and projecting — or a standby taking over — ends with exactly the state the log says.
A projection that failed while the leader lives is repaired at its next commit or
its next lease pass (:meth:`ControlLog.repair_if_needed`), whichever comes first.

The log stays bounded: every :data:`~spanflow.control.snapshots.SNAPSHOT_EVERY`
records the leader stores a snapshot of the state (the ``SPANFLOW_SNAPSHOTS`` object
store, as many copies as the log) and purges the records before it, but for a tail
kept for the history; recovery starts from the snapshot (:mod:`spanflow.control.snapshots`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import APIError, KeyNotFoundError, NoKeysError, ObjectNotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from pydantic import BaseModel, ValidationError

from spanflow.control import records as r
from spanflow.control import snapshots
from spanflow.control.errors import Unavailable
from spanflow.control.state import ClusterState, StaleRecord, apply
from spanflow.nats.cluster import (
    ASSIGNMENTS_BUCKET,
    META_BUCKET,
    NODES_BUCKET,
    PIPELINES_BUCKET,
    WAL_PREFIX,
    WAL_STREAM,
    ensure_kv,
    ensure_log_streams,
    ensure_object_store,
)
from spanflow.nats.ranges import read_range
from spanflow.protocol.names import PROJECTION_BUCKETS
from spanflow.protocol.names import SNAPSHOTS_BUCKET as SNAPSHOTS
from spanflow.security.signing import Signer

log = logging.getLogger(__name__)

BUCKETS = PROJECTION_BUCKETS
SNAPSHOT_OBJECT = "state"
WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a refused expected-last-sequence append."""
APPEND_PATIENCE = 15.0
"""Seconds an append waits for the log's stream to elect a leader before giving up."""

Projection = dict[tuple[str, str], bytes]


def projection(state: ClusterState, signer: Signer | None = None) -> Projection:
    """What the KV buckets hold for ``state``: (bucket, key) → JSON. With a ``signer``
    (locked), assignments — what makes a node import and run code — are signed
    envelopes (spanflow.security.signing) the agents verify."""
    out: Projection = {}

    def add(bucket: str, key: str, model: BaseModel) -> None:
        value = model.model_dump_json().encode()
        if signer is not None and bucket == ASSIGNMENTS_BUCKET:
            value = signer.envelope(value)
        out[(bucket, key)] = value

    add(META_BUCKET, "topology", state.topology)
    for name, node in state.nodes.items():
        add(NODES_BUCKET, name, node)
    for name, pipeline in state.pipelines.items():
        add(PIPELINES_BUCKET, name, pipeline)
    for a in state.assignments.values():
        add(ASSIGNMENTS_BUCKET, a.key, a)
    return out


def changed_keys(before: ClusterState, after: ClusterState) -> set[tuple[str, str]]:
    """Keys whose value may differ: values are replaced, never mutated, so identity
    tells (cheaply) what a record touched."""
    keys: set[tuple[str, str]] = set()
    if before.topology is not after.topology:
        keys.add((META_BUCKET, "topology"))
    for bucket, old, new in (
        (NODES_BUCKET, before.nodes, after.nodes),
        (PIPELINES_BUCKET, before.pipelines, after.pipelines),
    ):
        for name in old.keys() | new.keys():
            if old.get(name) is not new.get(name):
                keys.add((bucket, name))
    for fid in before.assignments.keys() | after.assignments.keys():
        a, b = before.assignments.get(fid), after.assignments.get(fid)
        if a is not b:
            keys.update((ASSIGNMENTS_BUCKET, x.key) for x in (a, b) if x is not None)
    return keys


class ControlLog:
    """The log and its snapshots over ``nc`` (locked: the control account, where no
    application identity can make the server publish), the KV projection the agents
    read in ``buckets`` (their account)."""

    def __init__(
        self,
        nc: Client,
        buckets: dict[str, KeyValue],
        snapshots: ObjectStore,
        signer: Signer | None = None,
    ) -> None:
        self.nc = nc
        self.signer = signer
        """Signs projected assignments (locked mode); None: plain values."""
        self.js = nc.jetstream()
        self.buckets = buckets
        self.snapshots = snapshots
        self.snapshot_at = 0
        """Log sequence the latest snapshot this replica knows includes."""
        self._lock = asyncio.Lock()
        self._needs_repair = False
        self._expected: Projection | None = None
        """What this replica last made the projection hold (None: not known yet)."""
        self._guarding = False
        self.tampered = 0
        """Projection changes nobody here made (a forged delete, say), each repaired."""

    @classmethod
    async def open(
        cls,
        nc: Client,
        replicas: int | None = None,
        *,
        data_nc: Client | None = None,
        signer: Signer | None = None,
    ) -> ControlLog:
        """Open (creating what is missing) the log and snapshots over ``nc``, the
        projection buckets and the activity log over ``data_nc`` (default ``nc``)."""
        js, data_js = nc.jetstream(), (data_nc or nc).jetstream()
        await ensure_log_streams(js, replicas, activity_js=data_js)
        buckets = {name: await ensure_kv(data_js, name, replicas=replicas) for name in BUCKETS}
        store = await ensure_object_store(js, SNAPSHOTS, replicas=replicas)
        opened = cls(nc, buckets, store, signer)
        await opened._watch_projection(data_nc or nc)
        return opened

    async def _watch_projection(self, nc: Client) -> None:
        """Notice a projection change nobody here made. The buckets live in the
        application account, where an agent can have the server write for it (a stored
        ``KV-Operation: DEL`` fetched by DIRECT.GET with a bucket's subject as reply-to
        lands as a delete); no signature covers a delete, so the leader repairs whatever
        differs from what it projected, at its next lease pass."""
        for bucket in BUCKETS:
            prefix = f"$KV.{bucket}."
            await nc.subscribe(f"{prefix}>", cb=self._projection_message(bucket, prefix))

    def guard(self, leading: bool) -> None:
        """Watch the projection for changes nobody here made while this replica leads
        (it alone writes the projection); a new leader checks every key once."""
        self._guarding = leading
        if leading:
            self._expected = None
            self._needs_repair = True

    def _projection_message(self, bucket: str, prefix: str) -> Callable[[Msg], Awaitable[None]]:
        async def seen(msg: Msg) -> None:
            expected = self._expected
            if expected is None or not self._guarding:
                return
            key = msg.subject[len(prefix) :]
            headers = msg.headers or {}
            operation = headers.get("KV-Operation")
            value = None if operation in ("DEL", "PURGE") else msg.data
            try:
                # A rollup (this replica never writes one) may have wiped every key
                differs = "Nats-Rollup" in headers or _differs(expected.get((bucket, key)), value)
            except orjson.JSONDecodeError:
                differs = True
            if differs:
                self.tampered += 1
                self._needs_repair = True
                log.warning("KV projection %s/%s changed by someone else: repairing", bucket, key)

        return seen

    # -- writing ---------------------------------------------------------------------------
    async def commit(self, state: ClusterState, records: list[r.Record]) -> int:
        """Append each record (refused if the log moved on without us), apply it to
        ``state``, then bring the KV projection in line. Returns the last sequence."""
        if not records:
            return state.applied
        async with self._lock:
            await self._repair_pending(state)
            before = state.copy()
            try:
                for record in records:
                    seq = await self._append(record, state.applied)
                    apply(state, record)
                    state.applied = seq
            finally:  # what was appended is applied: project it even if a later append failed
                await self._project(changed_keys(before, state), state)
            if snapshots.due(state.applied, self.snapshot_at):
                await self._snapshot(state)
            return state.applied

    async def _snapshot(self, state: ClusterState) -> None:
        """Store the state, then purge the records it makes unnecessary. A failure
        leaves the log as it was (longer, never shorter than the snapshots allow)."""
        try:
            await self.snapshots.put(SNAPSHOT_OBJECT, snapshots.encode(state))
            self.snapshot_at = state.applied
            first = await self.first_seq()
            keep = snapshots.purge_below(state.applied)
            if keep > first:
                await self.js.purge_stream(WAL_STREAM, seq=keep)
        except NatsError as exc:
            log.warning("control log snapshot at %d failed (%s); next time", state.applied, exc)
            return
        log.info("control log snapshot at %d; records before %d purged", state.applied, keep)

    async def _latest_snapshot(self) -> ClusterState | None:
        try:
            data = (await self.snapshots.get(SNAPSHOT_OBJECT)).data
        except ObjectNotFoundError:
            return None
        try:
            state = snapshots.decode(data or b"")
        except (ValueError, ValidationError) as exc:
            raise Unavailable(
                "snapshot_unreadable",
                f"the control log's snapshot ({SNAPSHOTS}/{SNAPSHOT_OBJECT}) is unreadable: "
                f"{exc}; the records before it are purged, so the state cannot be rebuilt "
                "without it (restore the object or the stream from a backup)",
            ) from None
        self.snapshot_at = max(self.snapshot_at, state.applied)
        return state

    async def repair_if_needed(self, state: ClusterState) -> None:
        """Bring the KV projection in line now if a projection failed, without waiting
        for the next commit: a quiet cluster may not commit again for minutes, and the
        agents watch the projection, not the log (an assignment whose projection failed
        while a NATS server restarted left its fragment starting forever)."""
        async with self._lock:
            await self._notice_loss()
            await self._repair_pending(state)

    async def _notice_loss(self) -> None:
        """Whether a bucket holds fewer messages than the keys it should: a purge
        through the stream API (no message on the bucket's subjects tells of it) or a
        rollup this replica missed. Every live key is a message, so fewer is a loss."""
        expected = self._expected
        if expected is None or not self._guarding or self._needs_repair:
            return
        wanted: dict[str, int] = {}
        for bucket, _ in expected:
            wanted[bucket] = wanted.get(bucket, 0) + 1
        for bucket, count in wanted.items():
            try:
                held = int((await self.buckets[bucket].status()).values)
            except NatsError as exc:
                log.debug("KV projection check of %s failed: %s", bucket, exc)
                continue
            if held < count:
                self.tampered += 1
                self._needs_repair = True
                log.warning("KV projection %s lost %d keys: repairing", bucket, count - held)
                return

    async def _repair_pending(self, state: ClusterState) -> None:
        if not self._needs_repair:
            return
        self._needs_repair = False  # set again by _project if a key fails
        try:
            repaired = await self._repair(state)
        except NatsError as exc:  # reading the projection failed: try again later
            self._needs_repair = True
            log.warning("KV projection repair failed (%s); trying again", exc)
            return
        if repaired and not self._needs_repair:
            log.info("KV projection repaired: %d keys", repaired)

    async def _append(self, record: r.Record, after: int) -> int:
        """Append after sequence ``after``. While the stream has no leader (a server of
        the cluster died; an election takes seconds) the append is retried under the
        same message id, so one that did land is not appended twice."""
        deadline = time.monotonic() + APPEND_PATIENCE
        delay = 0.1
        while True:
            try:
                ack = await self.js.publish(
                    f"{WAL_PREFIX}.{record.kind}",
                    r.encode(record),
                    headers={
                        "Nats-Expected-Last-Sequence": str(after),
                        "Nats-Msg-Id": f"wal-{after + 1}-e{record.epoch}",
                    },
                )
                return int(ack.seq)
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    raise Unavailable(
                        "stale_leader",
                        f"the control log moved past {after}: another coordinator wrote to it",
                    ) from None
                if exc.code != 503 or time.monotonic() > deadline:
                    raise
            except NatsError:  # no responders, no stream response, a timeout: an election
                if time.monotonic() > deadline:
                    raise Unavailable(
                        "log_unavailable",
                        f"the control log did not answer for {APPEND_PATIENCE:.0f} s",
                    ) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _project(self, keys: set[tuple[str, str]], state: ClusterState) -> None:
        wanted = projection(state, self.signer)
        if self._expected is None:
            self._expected = dict(wanted)
        try:
            for bucket, key in sorted(keys):
                value = wanted.get((bucket, key))
                kv = self.buckets[bucket]
                if value is None:  # before the write: its echo is then no surprise
                    self._expected.pop((bucket, key), None)
                else:
                    self._expected[(bucket, key)] = value
                if value is None:
                    await kv.delete(key)
                else:
                    await kv.put(key, value)
        except NatsError as exc:
            # The log has the records: the next commit repairs KV from the state.
            log.warning("KV projection failed (%s); repairing at the next commit", exc)
            self._needs_repair = True

    # -- reading ---------------------------------------------------------------------------
    async def last_seq(self) -> int:
        return int((await self.js.stream_info(WAL_STREAM)).state.last_seq)

    async def first_seq(self) -> int:
        return int((await self.js.stream_info(WAL_STREAM)).state.first_seq)

    async def records(self, after: int, upto: int | None = None) -> list[tuple[int, r.Record]]:
        """Typed records with ``after < seq <= upto`` (default: the end of the log).
        Records this version cannot read (an older format) are skipped with a warning."""
        last = await self.last_seq() if upto is None else upto
        out = []
        for m in await read_range(self.nc, WAL_STREAM, after + 1, last + 1):
            try:
                out.append((m.seq, r.decode(m.data)))
            except ValidationError as exc:
                log.warning("control log record %d is unreadable, skipped: %s", m.seq, exc)
        return out

    async def recover(self) -> tuple[ClusterState, int]:
        """The state the whole log describes, and how many records made it; the KV
        projection is repaired to match it."""
        async with self._lock:
            state = await self._latest_snapshot() or ClusterState()
            replayed = await self.follow(state)
            repaired = await self._repair(state)
            if repaired:
                log.info("control log recovery repaired %d KV keys", repaired)
            return state, len(replayed)

    async def follow(self, state: ClusterState) -> list[tuple[int, r.Record]]:
        """Apply the records appended after ``state.applied`` (a standby's tail). One
        that fell behind the purge starts again from the latest snapshot."""
        info = await self.js.stream_info(WAL_STREAM)
        last, first = int(info.state.last_seq), int(info.state.first_seq)
        if last <= state.applied:
            return []
        if state.applied + 1 < first:
            latest = await self._latest_snapshot()
            if latest is None or latest.applied + 1 < first:
                raise Unavailable(
                    "log_purged",
                    f"the control log starts at {first}, this state ends at {state.applied}, "
                    "and no snapshot covers the gap",
                )
            log.info(
                "state %d is behind the log's purge (%d): from the snapshot at %d",
                state.applied,
                first,
                latest.applied,
            )
            _replace(state, latest)
        replayed = await self.records(state.applied, last)
        for seq, record in replayed:
            try:
                apply(state, record)
            except StaleRecord as exc:
                log.warning("control log record %d refused: %s", seq, exc)
        state.applied = last
        return replayed

    async def _repair(self, state: ClusterState) -> int:
        wanted = projection(state, self.signer)
        actual: Projection = {}
        for bucket in (NODES_BUCKET, PIPELINES_BUCKET, ASSIGNMENTS_BUCKET):
            for key, value in (await self._load_raw(bucket)).items():
                actual[(bucket, key)] = value
        meta = await self._load_raw(META_BUCKET)
        if "topology" in meta:
            actual[(META_BUCKET, "topology")] = meta["topology"]
        keys = {k for k in wanted.keys() | actual.keys() if _differs(wanted.get(k), actual.get(k))}
        self._expected = dict(wanted)
        await self._project(keys, state)
        return len(keys)

    async def _load_raw(self, bucket: str) -> dict[str, bytes]:
        kv = self.buckets[bucket]
        try:
            keys = await kv.keys()
        except NoKeysError:
            return {}
        out: dict[str, bytes] = {}
        for key in keys:
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                out[key] = entry.value
        return out

    async def history(self, after: int = 0, limit: int = 200) -> list[tuple[int, r.Record]]:
        """The last ``limit`` control records after sequence ``after`` (for the API)."""
        info = await self.js.stream_info(WAL_STREAM)
        last = int(info.state.last_seq)
        start = max(after, last - limit, int(info.state.first_seq) - 1)
        return await self.records(start, last)


def _replace(state: ClusterState, other: ClusterState) -> None:
    """Make ``state`` (an object others hold) the same as ``other``."""
    for name in ClusterState.__dataclass_fields__:
        setattr(state, name, getattr(other, name))


def _differs(a: bytes | None, b: bytes | None) -> bool:
    if a is None or b is None:
        return a is not b
    return bool(orjson.loads(a) != orjson.loads(b))
