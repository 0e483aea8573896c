"""publish_patiently: a publish waits out its stream's leader election (a NATS server
died) and is stored once; a subject no stream captures is refused at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nats.js.api import StreamConfig

from spanflow.nats.server import NatsCluster
from spanflow.nats.streams import NoStreamCaptures, connect, publish_patiently

pytestmark = pytest.mark.slow


def test_a_subject_no_stream_captures_is_refused_at_once(nats_url: str) -> None:
    async def go() -> float:
        nc = await connect(nats_url)
        started = time.monotonic()
        try:
            with pytest.raises(NoStreamCaptures, match=r"nowhere\.x"):
                await publish_patiently(nc.jetstream(), "nowhere.x", b"{}", timeout=10)
        finally:
            await nc.close()
        return time.monotonic() - started

    assert asyncio.run(go()) < 2.0


def test_a_publish_waits_out_the_election_and_is_stored_once(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats", 3) as cluster:
        urls = [s.url for s in cluster.servers]

        async def go() -> tuple[int, int]:
            admin = await connect(cluster.url)
            js = admin.jetstream()
            deadline = time.monotonic() + 60
            while True:  # the cluster's meta leader may still be electing
                try:
                    await js.add_stream(StreamConfig(name="PP", subjects=["pp"], num_replicas=3))
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.5)
            info = await js.stream_info("PP")
            assert info.cluster is not None and info.cluster.leader
            victim = int(info.cluster.leader.rsplit("-", 1)[1]) - 1
            await admin.close()
            device = await connect(urls[(victim + 1) % 3])  # a survivor's client
            cluster.servers[victim].kill()
            for n in range(3):
                await publish_patiently(
                    device.jetstream(), "pp", b"{}", headers={"Nats-Msg-Id": f"m{n}"}, timeout=20
                )
            state = (await device.jetstream().stream_info("PP")).state
            await device.close()
            return state.messages, state.last_seq

        assert asyncio.run(go()) == (3, 3)
