"""The control log on a real NATS server: appends are compare-and-set on the log's last
sequence (a second writer is refused), and recovery rebuilds state and KV from the log."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js.errors import NoKeysError

from spanflow.control import records as r
from spanflow.control.errors import Unavailable
from spanflow.control.log import ControlLog, projection
from spanflow.control.state import ClusterState
from spanflow.nats.cluster import ASSIGNMENTS_BUCKET, NODES_BUCKET
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.spec.cluster import NodeRecord, NodeState
from spanflow.spec.topology import NodeSpec, Site


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path / "nats") as s:
        yield s


def _node(name: str) -> r.NodeRegistered:
    record = NodeRecord(spec=NodeSpec(name=name, site="s"), state=NodeState.ALIVE)
    return r.NodeRegistered(at=1.0, node=record)


def test_a_second_writer_is_refused_and_recovery_repairs_kv(server: EmbeddedNats) -> None:
    async def go() -> None:
        nc1, nc2 = await connect(server.url), await connect(server.url)
        leader, other = await ControlLog.open(nc1), await ControlLog.open(nc2)
        state = ClusterState()
        site = r.SitePut(at=0.5, site=Site(name="s"))
        assert await leader.commit(state, [site, _node("a1")]) == 2
        stale, _ = await other.recover()
        assert await leader.commit(state, [_node("b1")]) == 3
        # The other writer's view ends at 2: its append is refused, its state untouched.
        with pytest.raises(Unavailable) as refused:
            await other.commit(stale, [r.NodeRemoved(at=2.0, node="a1")])
        assert refused.value.code == "stale_leader"
        assert set(stale.nodes) == {"a1"} and stale.applied == 2
        assert await other.last_seq() == 3

        # KV damaged behind the log's back (a crash between append and projection).
        await leader.buckets[NODES_BUCKET].delete("b1")
        await leader.buckets[ASSIGNMENTS_BUCKET].put("ghost.x", b"{}")
        recovered, count = await other.recover()
        assert count == 3 and recovered.applied == 3
        assert projection(recovered) == projection(state)
        assert (await leader.buckets[NODES_BUCKET].get("b1")).value is not None
        assert "ghost.x" not in await _keys(leader, ASSIGNMENTS_BUCKET)
        # Now up to date, the same writer commits.
        assert await other.commit(recovered, [r.NodeRemoved(at=3.0, node="a1")]) == 4
        await nc1.close()
        await nc2.close()

    asyncio.run(go())


def test_a_failed_projection_is_repaired_without_waiting_for_a_commit(
    server: EmbeddedNats,
) -> None:
    async def go() -> None:
        nc = await connect(server.url)
        leader = await ControlLog.open(nc)
        state = ClusterState()
        await leader.commit(state, [r.SitePut(at=0.5, site=Site(name="s")), _node("a1")])
        # The projection of a1 failed (a NATS server restarting): the log has it, KV not
        await leader.buckets[NODES_BUCKET].delete("a1")
        leader._needs_repair = True
        await leader.repair_if_needed(state)
        assert (await leader.buckets[NODES_BUCKET].get("a1")).value is not None
        assert not leader._needs_repair
        await nc.close()

    asyncio.run(go())


async def _keys(log: ControlLog, bucket: str) -> list[str]:
    try:
        return list(await log.buckets[bucket].keys())
    except NoKeysError:
        return []


@pytest.fixture
def fast_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """Without an fsync per message: 100,000 records are written in a second."""
    with EmbeddedNats(tmp_path / "nats", sync_always=False) as s:
        yield s


def test_a_long_log_recovers_from_its_snapshot_and_stays_bounded(
    fast_server: EmbeddedNats,
) -> None:
    """A 100,000-record log: the first commit after recovery stores a snapshot and purges
    all but a tail; a replica recovering then replays only what followed the snapshot,
    to the same state a full replay gives. A standby whose view fell behind the purge
    catches up from the snapshot."""
    from spanflow.control import snapshots
    from spanflow.nats.cluster import WAL_PREFIX

    total = 100_501  # a site, then 201 rounds of 500 nodes registered or removed

    def record(i: int) -> r.Record:
        if i == 0:
            return r.SitePut(at=0.0, site=Site(name="s"))
        name, round_ = f"n{(i - 1) % 500}", (i - 1) // 500
        if round_ % 2 == 0:
            return _node(name)
        return r.NodeRemoved(at=float(i), node=name)

    async def go() -> None:
        server = fast_server
        nc = await connect(server.url)
        leader = await ControlLog.open(nc)
        # Written in bulk (core publishes the stream captures), then checked by count.
        for i in range(total):
            rec = record(i)
            await nc.publish(f"{WAL_PREFIX}.{rec.kind}", r.encode(rec))
        await nc.flush()
        while await leader.last_seq() < total:
            await asyncio.sleep(0.05)
        behind, _ = await leader.recover()  # a standby's view: full replay
        assert behind.applied == total and len(behind.nodes) == 500

        state, replayed = await leader.recover()
        assert replayed == total and leader.snapshot_at == 0
        # The next commit is past due: snapshot, then purge all but the tail.
        await leader.commit(state, [_node("extra")])
        assert leader.snapshot_at == total + 1
        first = await leader.first_seq()
        assert first == snapshots.purge_below(total + 1) and first > total - 2 * snapshots.KEEP_TAIL
        await leader.commit(state, [_node("after-snapshot")])

        replica = await ControlLog.open(await connect(server.url))
        recovered, replayed = await replica.recover()
        assert replayed == 1  # only the record after the snapshot
        assert projection(recovered) == projection(state) and recovered.applied == state.applied

        # A standby whose view ends before the purge follows from the snapshot.
        stale = behind
        stale.applied = first - 10  # its next record is purged
        await replica.follow(stale)
        assert projection(stale) == projection(state) and stale.applied == state.applied

    asyncio.run(go())
