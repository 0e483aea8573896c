"""A link that goes silent — a dead host, a dropped route: nothing is closed — is left
for another server within seconds, not nats-py's minutes (``nats/streams.connect``)."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlparse

from spanflow.nats.relay import WanRelay
from spanflow.nats.streams import CONNECT_TIMEOUT, MAX_OUTSTANDING_PINGS, PING_INTERVAL, connect

STALE_AFTER = PING_INTERVAL * (MAX_OUTSTANDING_PINGS + 1)
MOVED_WITHIN = STALE_AFTER + CONNECT_TIMEOUT + 2.0
"""Stale, then perhaps one try of the silent server again before the other one."""


def test_a_client_leaves_a_silent_link_for_another_server(nats_url: str) -> None:
    server = urlparse(nats_url)
    relays = [WanRelay(server.hostname or "127.0.0.1", server.port or 0).start() for _ in "ab"]
    urls = ",".join(f"nats://127.0.0.1:{r.port}" for r in relays)

    async def scenario() -> tuple[float, int, int]:
        nc = await connect(urls)
        try:
            used = next(r for r in relays if r.port == nc.connected_url.port)
            other = next(r for r in relays if r is not used)
            used.silence()  # the cable is pulled: no close, no refusal, no byte
            began = time.monotonic()
            while nc.connected_url is None or nc.connected_url.port != other.port:
                assert time.monotonic() - began < MOVED_WITHIN + 5, "still on the silent link"
                await asyncio.sleep(0.1)
            moved_after = time.monotonic() - began
            await nc.flush(timeout=5)  # the new link carries traffic
            return moved_after, nc.connected_url.port, other.port
        finally:
            await nc.close()

    try:
        moved_after, now_on, other = asyncio.run(scenario())
    finally:
        for relay in relays:
            relay.stop()
    assert now_on == other
    assert PING_INTERVAL <= moved_after <= MOVED_WITHIN, moved_after  # told by its pings
