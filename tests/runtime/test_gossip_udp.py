"""Membership over real UDP and TCP sockets on loopback (local_test profile)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

from spanflow.runtime.membership.config import MembershipConfig
from spanflow.runtime.membership.messages import Alive, State, encode
from spanflow.runtime.membership.udp import GossipService, split_addr
from spanflow.security.keyring import Keyring, new_key

CONFIG = MembershipConfig.local_test()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds (fails the test after ``timeout`` seconds)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.02)


def sees(a: GossipService, b: GossipService, state: State) -> bool:
    assert a.membership is not None
    return a.membership.state_of(b.name) == state


async def three() -> list[GossipService]:
    services = [GossipService(f"n{i}", CONFIG) for i in range(3)]
    try:
        await services[0].start()
        for s in services[1:]:
            await s.start(seeds=[services[0].addr])
        await until(
            lambda: all(sees(a, b, State.ALIVE) for a in services for b in services if a is not b)
        )
    except BaseException:
        for s in services:
            await s.close()
        raise
    return services


def test_three_members_join_detect_a_crash_and_see_a_leave() -> None:
    async def scenario() -> None:
        a, b, c = await three()
        try:
            await c.close()  # a crash: no goodbye
            await until(lambda: sees(a, c, State.DEAD) and sees(b, c, State.DEAD))
            assert a.stats.datagrams_in > 0 and a.stats.reliable_in > 0
            await b.leave()
            await until(lambda: sees(a, b, State.LEFT))
        finally:
            for s in (a, b, c):
                await s.close()

    asyncio.run(scenario())


def test_garbage_on_the_gossip_port_is_counted_and_dropped() -> None:
    async def scenario() -> None:
        a, b, c = await three()
        try:
            host, port = split_addr(a.addr)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
                raw.sendto(b"\x00\xffnot a packet", (host, port))
                raw.sendto(b'[["S", "x", 1, 2]]', (host, port))
            _, writer = await asyncio.open_connection(host, port)
            writer.write(b"\x00\x00\x00\x05abc")  # a frame cut short
            writer.close()
            await until(lambda: a.stats.malformed >= 3)
            await c.close()
            await until(lambda: sees(a, c, State.DEAD))  # membership goes on
        finally:
            for s in (a, b, c):
                await s.close()

    asyncio.run(scenario())


def test_addresses_are_host_and_port() -> None:
    assert split_addr("10.1.2.3:7946") == ("10.1.2.3", 7946)
    with pytest.raises(ValueError, match="host:port"):
        split_addr("10.1.2.3")


def test_sealed_gossip_admits_the_keyring_and_drops_forgeries() -> None:
    """With a keyring every packet is sealed (AES-GCM): members sharing a key converge;
    a member with another key is never admitted and its packets are counted as
    rejected; a plain (forged) packet is dropped; keys rotate without a restart."""

    async def scenario() -> None:
        old, new = new_key(), new_key()
        ring = Keyring((old,))
        services = [GossipService(f"s{i}", CONFIG, keyring=ring) for i in range(3)]
        intruder = GossipService("intruder", CONFIG, keyring=Keyring((new_key(),)))
        try:
            await services[0].start()
            for s in services[1:]:
                await s.start(seeds=[services[0].addr])
            a, b, c = services
            await until(
                lambda: all(
                    sees(x, y, State.ALIVE) for x in services for y in services if x is not y
                )
            )
            await intruder.start(seeds=[a.addr])
            host, port = split_addr(a.addr)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
                raw.sendto(b'[["alive", "forger", 99, "127.0.0.1:1"]]', (host, port))
            await until(lambda: a.stats.rejected >= 2)
            assert a.membership is not None and "intruder" not in a.membership.members
            assert "forger" not in a.membership.members
            # rotation: install the new key everywhere, switch every member, drop the old
            for s in services:
                s.keyring = s.keyring.install(new) if s.keyring else None
            for s in services:
                s.keyring = s.keyring.use(new) if s.keyring else None
            for s in services:
                s.keyring = s.keyring.remove(old) if s.keyring else None
            rejected = a.stats.rejected
            await c.close()  # still detected: the group talks under the new key
            await until(lambda: sees(a, c, State.DEAD) and sees(b, c, State.DEAD))
            assert sees(a, b, State.ALIVE) and sees(b, a, State.ALIVE)
            assert a.stats.rejected >= rejected  # only the intruder's packets are refused
        finally:
            for s in (*services, intruder):
                await s.close()

    asyncio.run(scenario())


def test_a_recorded_sealed_packet_sent_again_is_refused() -> None:
    """A sealed packet is accepted once: the same bytes again (a replay by someone on
    the path, who cannot read or forge them) are dropped and counted, as is one sealed
    long ago under the right key."""

    async def scenario() -> None:
        ring = Keyring((new_key(),))
        a, b = (GossipService(f"r{i}", CONFIG, keyring=ring) for i in range(2))
        try:
            await a.start()
            await b.start(seeds=[a.addr])
            await until(lambda: sees(a, b, State.ALIVE) and sees(b, a, State.ALIVE))
            host, port = split_addr(a.addr)
            fresh = ring.seal(encode([Alive(1, "ghost", "127.0.0.1:9")]))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
                raw.sendto(fresh, (host, port))
                await until(lambda: a.membership is not None and "ghost" in a.membership.members)
                rejected = a.stats.rejected
                raw.sendto(fresh, (host, port))  # the same packet again
                old = ring.seal(encode([Alive(1, "ghost-2", "127.0.0.1:8")]), at=time.time() - 600)
                raw.sendto(old, (host, port))
            await until(lambda: a.stats.rejected >= rejected + 2)
            assert a.membership is not None and "ghost-2" not in a.membership.members
        finally:
            for s in (a, b):
                await s.close()

    asyncio.run(scenario())


def test_a_flood_of_forged_frames_from_one_host_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """100 unsealed reliable frames (each from a new source port) and 100 datagrams
    from one host: all counted, one warning."""

    async def scenario() -> None:
        a = GossipService("a", CONFIG, keyring=Keyring((new_key(),)))
        await a.start()
        try:
            host, port = split_addr(a.addr)
            forged = encode([Alive(9, "forger", "127.0.0.1:1")])
            for _ in range(100):
                _, writer = await asyncio.open_connection(host, port)
                writer.write(len(forged).to_bytes(4, "big") + forged)
                await writer.drain()
                writer.close()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
                for _ in range(100):
                    raw.sendto(forged, (host, port))
            await until(lambda: a.stats.rejected >= 150)
        finally:
            await a.close()

    with caplog.at_level("WARNING", logger="spanflow.runtime.membership.udp"):
        asyncio.run(scenario())
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 1, [r.getMessage() for r in caplog.records]
    assert "127.0.0.1:" in dropped[0].getMessage()
