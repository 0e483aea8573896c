"""Hot standby on a real cluster (embedded NATS, the coordinator, two agents with their
own Spark): a pipeline with ``standby: 1`` runs on both nodes; SIGKILL of either
replica's machine (agent, JVM and Python workers at once) during a steady stream must
leave no gap in the output longer than 2 s, and every reading and every window must
come out exactly once."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanflow.local.cluster import Api, LocalCluster
from spanflow.nats.streams import connect
from tests.cluster import test_chaos as chaos
from tests.helpers import Feed, assert_feed_exactly_once, stored, wait_for

pytestmark = pytest.mark.slow

PIPELINE = chaos.PIPELINE.replace(
    "name: chaos\ntrigger: 0.5s", "name: hot\ntrigger: 1s\nstandby: 1"
)
"""The chaos test's pipeline (a filter and a 2-s window per device, two JetStream sinks)
with a standby replica of its fragment."""

MAX_GAP = 2.0
"""Seconds the output may pause around a replica's death (the issue's bound)."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    topology = tmp_path / "topology.yaml"
    topology.write_text(chaos.TOPOLOGY)
    c = LocalCluster(topology, tmp_path / "data", port=0)
    try:
        yield c.start()
    finally:
        c.stop()


def replicas(api: Api) -> dict[str, dict[str, Any]]:
    """fragment id → its status answer (node, status, replica)."""
    answer = api.call("GET", "/api/v1/pipelines/hot")
    return {f["id"]: f for f in answer["fragments"]}


def both_running(api: Api) -> bool:
    found = replicas(api)
    return len(found) == 2 and all(f["status"] == "running" and f["node"] for f in found.values())


def both_caught_up(api: Api) -> bool:
    """Both replicas run and neither is more than a second of readings behind: a
    restarted replica replays the batches it missed before it stands by again."""
    found = replicas(api)
    return both_running(api) and all(
        f["runtime"] is not None and f["runtime"]["batches"] > 0 and f["runtime"]["lag"] <= 50
        for f in found.values()
    )


def store_times(url: str, stream: str) -> list[float]:
    """When JetStream stored each message of ``stream`` (Unix seconds), in order."""

    async def go() -> list[float]:
        nc = await connect(url)
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                m = await js.get_msg(stream, seq)
                assert m.time is not None
                out.append(m.time.timestamp())
            return out
        finally:
            await nc.close()

    return asyncio.run(go())


def last_stored_at(url: str, stream: str) -> float:
    """When JetStream stored the last message of ``stream`` (0: none yet)."""

    async def go() -> float:
        nc = await connect(url)
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
            if not info.state.last_seq:
                return 0.0
            m = await js.get_msg(stream, info.state.last_seq)
            return m.time.timestamp() if m.time is not None else 0.0
        finally:
            await nc.close()

    return asyncio.run(go())


def longest_pause(times: list[float], start: float, end: float) -> float:
    """The longest stretch inside [start, end] with nothing stored."""
    inside = [start, *(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(inside))


def kill_a_replica(cluster: LocalCluster, api: Api, fragment: str) -> float:
    """SIGKILL the machine running ``fragment`` while the stream flows; returns the
    longest output pause from 1 s before the kill to 12 s after, then restarts the
    machine and waits until both replicas run again."""
    node = replicas(api)[fragment]["node"]
    killed_at = time.time()
    cluster.kill(f"node-{node}", tree=True)
    wait_for(lambda: last_stored_at(cluster.nats_url, "CH_EVENTS") > killed_at + 12, timeout=60)
    pause = longest_pause(
        store_times(cluster.nats_url, "CH_EVENTS"), killed_at - 1.0, killed_at + 12.0
    )
    print(f"{fragment} on {node} killed: longest output pause {pause:.2f} s")
    cluster.start_node(node)
    started = time.monotonic()
    wait_for(lambda: both_caught_up(api), timeout=240)
    print(f"{node} restarted: its replica caught up {time.monotonic() - started:.1f} s later")
    return pause


def test_either_replicas_death_leaves_no_gap_and_nothing_twice(cluster: LocalCluster) -> None:
    api = Api(cluster.url, None, patience=30)
    feed = Feed(cluster.nats_url, "CH_IN", "chin", rate=50)
    api.call("POST", "/api/v1/pipelines", {"yaml": PIPELINE})
    wait_for(lambda: both_caught_up(api), timeout=240)
    placed = replicas(api)
    assert placed["hot.f0"]["node"] != placed["hot.f0.r1"]["node"]
    assert placed["hot.f0.r1"]["replica"] == 1
    seen = stored(cluster.nats_url, "CH_EVENTS")
    wait_for(lambda: stored(cluster.nats_url, "CH_EVENTS") > seen + 100, timeout=120)

    pauses = [kill_a_replica(cluster, api, f) for f in ("hot.f0", "hot.f0.r1")]

    sent = feed.stop()
    assert_feed_exactly_once(cluster.nats_url, "CH_EVENTS", "CH_WINDOWS", sent)
    assert max(pauses) <= MAX_GAP, f"output paused {pauses} s when a replica died"
