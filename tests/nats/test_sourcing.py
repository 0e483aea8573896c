"""Catch-up that starts when the link does: a cloud stream sourcing a site's stream
resumes within seconds of the leaf link's return, whatever the cut's length, with
every message copied exactly once (nats/sourcing.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import orjson
import pytest

from spanflow.nats import EmbeddedNats
from spanflow.nats.relay import WanRelay
from spanflow.nats.sourcing import SourcingWatch, stalled_sources
from spanflow.nats.streams import connect, ensure_sourced, ensure_stream

pytestmark = pytest.mark.slow
RESUME_BOUND = 5.0


@pytest.fixture
def hub_and_site(tmp_path: Path) -> Iterator[tuple[EmbeddedNats, EmbeddedNats, WanRelay]]:
    hub = EmbeddedNats(tmp_path / "hub", name="hub", domain="hub", leaf_listen=True).start()
    leaf = urlparse(hub.leaf_url)
    relay = WanRelay(leaf.hostname or "127.0.0.1", leaf.port or 0).start()
    site = EmbeddedNats(tmp_path / "site", name="site", domain="site", leaf_remote=relay.url)
    site.start()
    try:
        yield hub, site, relay
    finally:
        site.stop()
        relay.stop()
        hub.stop()


def test_copies_resume_within_seconds_of_the_link_after_short_and_long_cuts(
    hub_and_site: tuple[EmbeddedNats, EmbeddedNats, WanRelay],
) -> None:
    hub, site, relay = hub_and_site

    async def go() -> list[tuple[float, float]]:
        h, s = await connect(hub.url), await connect(site.url)
        hj, sj = h.jetstream(), s.jetstream()
        await ensure_stream(sj, "SRC_CUT", ["srccut.>"])
        await ensure_sourced(hj, "SRC_CUT", "site")
        watch = SourcingWatch(h)
        sent = 0

        async def publish(n: int) -> None:
            nonlocal sent
            for _ in range(n):
                await sj.publish("srccut.x", str(sent).encode(), headers={"Nats-Msg-Id": str(sent)})
                sent += 1

        async def copied() -> int:
            return int((await hj.stream_info("SRC_CUT")).state.messages)

        async def watching() -> None:
            while True:
                await watch.check(["SRC_CUT"])
                await asyncio.sleep(1.0)

        async def until_copied(deadline: float) -> float:
            start = time.monotonic()
            while await copied() < sent:
                assert time.monotonic() - start < deadline, f"{await copied()} of {sent} copied"
                await asyncio.sleep(0.1)
            return time.monotonic() - start

        watcher = asyncio.create_task(watching())
        resumed = []
        try:
            await publish(10)
            await until_copied(30)
            for cut in (8.0, 30.0):
                relay.cut()
                cut_at = time.monotonic()
                while time.monotonic() - cut_at < cut:  # the site keeps buffering
                    await publish(5)
                    await asyncio.sleep(0.5)
                relay.restore()
                resumed.append((cut, await until_copied(60)))
        finally:
            watcher.cancel()
        info = await h.request("$JS.API.STREAM.INFO.SRC_CUT", b"")
        assert stalled_sources(orjson.loads(info.data)) == []
        # exactly once: every message, in order, no copy twice
        sub = await hj.subscribe("srccut.x", stream="SRC_CUT", ordered_consumer=True)
        got = [int((await sub.next_msg(timeout=5)).data) for _ in range(sent)]
        assert got == list(range(sent)) and await copied() == sent
        await h.close()
        await s.close()
        return resumed

    resumed = asyncio.run(go())
    print("cut (s) → copy caught up after the link returned (s):", resumed)
    assert all(after < RESUME_BOUND for _, after in resumed), resumed
