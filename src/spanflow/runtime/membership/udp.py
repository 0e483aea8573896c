"""The membership protocol over real sockets: datagrams over UDP, the reliable channel
over TCP, both on one port (memberlist's arrangement).

A thin shell around :class:`~.protocol.Membership`: it feeds the protocol what arrives,
wakes it at its next deadline, and sends what it returns. A peer's malformed packet is
logged (with the peer) and counted, never raised. Everything runs on the asyncio loop
that calls :meth:`GossipService.start`; the agent gives it a loop of its own so a busy
agent thread cannot delay acks.

On the TCP side one connection carries one length-prefixed frame (4 bytes, big-endian,
then the encoded messages): push-pull and fallback pings are rare and small enough
that reusing connections would not pay for its bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

from spanflow.clock import Clock, SystemClock
from spanflow.runtime.membership.config import MembershipConfig
from spanflow.runtime.membership.messages import MAX_PACKET, CodecError, decode, encode
from spanflow.runtime.membership.protocol import Change, Member, Membership, Send
from spanflow.security.keyring import OVERHEAD, Keyring, SealError
from spanflow.security.replay import ReplayGuard

log = logging.getLogger(__name__)

TCP_TIMEOUT = 2.0
"""Seconds a reliable send may take (connect + write) before it is given up."""
CLOSE_TIMEOUT = 5.0
"""How long close() waits for the protocol loop to end once cancelled."""
LOGGED_HOSTS = 256
"""Sending hosts whose first bad packet is logged; past them, bad packets are only
counted (a flood from spoofed addresses must not grow memory or the log)."""

ChangeListener = Callable[[list[Change]], None]


def split_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` → (host, port); a clear error for anything else."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a gossip address is host:port, not {addr!r}")
    return host.strip("[]"), int(port)


@dataclass
class GossipStats:
    datagrams_in: int = 0
    datagrams_out: int = 0
    reliable_in: int = 0
    reliable_out: int = 0
    malformed: int = 0
    send_errors: int = 0
    rejected: int = 0
    """Packets no key of the keyring opened (forged, another cluster's, plain text)."""


class GossipService:
    """One member on the network: ``await start()``, ``await leave()``, ``await close()``."""

    def __init__(
        self,
        name: str,
        config: MembershipConfig | None = None,
        *,
        bind: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        clock: Clock | None = None,
        on_change: ChangeListener | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self.name = name
        self.keyring = keyring
        """Seals every packet (AES-GCM) and opens what arrives; None: plain, for open
        mode. Swap it at any time to rotate keys (docs/security.md)."""
        self._logged_from: set[str] = set()
        self._replays = ReplayGuard()
        self.config = config or MembershipConfig.lan()
        self.host = bind
        self.port = port
        self.advertise = advertise or (bind if bind not in ("0.0.0.0", "") else "127.0.0.1")
        self.clock = clock or SystemClock()
        self.on_change = on_change
        self.stats = GossipStats()
        self.membership: Membership | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.base_events.Server | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()

    @property
    def addr(self) -> str:
        return f"{self.advertise}:{self.port}"

    async def start(self, seeds: list[str] | tuple[str, ...] = ()) -> None:
        """Bind (if :meth:`bind` was not called) and join ``seeds``."""
        if self._udp is None:
            await self.bind()
        loop = asyncio.get_running_loop()
        if self.keyring is not None:  # sealing adds bytes: keep datagrams under the MTU
            budget = self.config.packet_budget - OVERHEAD
            self.config = replace(self.config, packet_budget=budget)
        self.membership = Membership(
            self.name, self.addr, self.config, now=self.clock.monotonic(), rng=random.Random()
        )
        self._dispatch(self.membership.join(list(seeds), self.clock.monotonic()))
        self._task = loop.create_task(self._run(), name=f"gossip-{self.name}")
        log.info(
            "gossip %s on %s (%s profile, %s), seeds %s",
            self.name,
            self.addr,
            self.config.profile,
            "sealed with AES-GCM" if self.keyring else "PLAIN: anyone on the network may forge",
            list(seeds),
        )

    async def bind(self) -> None:
        """Bind UDP and TCP on one port (a free one if ``port`` is 0): the address is
        known (to register it) before the protocol starts."""
        loop = asyncio.get_running_loop()
        requested = self.port
        for _attempt in range(20):
            try:
                await self._bind(loop)
                break
            except OSError:
                self._close_sockets()
                if requested:
                    raise  # the port asked for is taken (UDP or TCP)
                self.port = 0
        else:  # pragma: no cover - twenty ports taken between two binds
            raise OSError("no free port for gossip (UDP and TCP)")

    async def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Datagrams(self), local_addr=(self.host, self.port), family=socket.AF_INET
        )
        self._udp = transport
        self.port = transport.get_extra_info("sockname")[1]
        self._tcp = await asyncio.start_server(self._on_connection, self.host, self.port)

    def join(self, seeds: list[str]) -> None:
        """Contact more seeds (e.g. peers the coordinator named later)."""
        if self.membership is not None:
            self._dispatch(self.membership.join(seeds, self.clock.monotonic()))

    def set_load(self, score: float, free_slots: int, connected: bool = True) -> None:
        if self.membership is not None:
            self.membership.set_load(score, free_slots, self.clock.monotonic(), connected=connected)

    def members(self) -> list[Member]:
        return [] if self.membership is None else list(self.membership.members.values())

    async def leave(self) -> None:
        """Say goodbye and keep gossiping it for ``leave_propagation`` seconds."""
        if self.membership is None or self.membership.leaving:
            return
        self._dispatch(self.membership.leave(self.clock.monotonic()))
        await asyncio.sleep(self.config.leave_propagation)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self._task
            self._task = None
        for task in list(self._sending):
            task.cancel()
        self._close_sockets()

    def _close_sockets(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
            self._tcp = None

    # -------------------------------------------------------------- the loop

    async def _run(self) -> None:
        membership = self.membership
        assert membership is not None
        while True:
            delay = membership.next_deadline() - self.clock.monotonic()
            if delay > 0:
                self._wake.clear()
                # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that
                # races the event being set, and close() would then wait forever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
            try:
                self._dispatch(membership.tick(self.clock.monotonic()))
            except Exception:  # a protocol bug must not end membership
                log.exception("gossip %s: tick failed", self.name)

    def received(self, data: bytes, peer: str, *, reliable: bool) -> None:
        membership = self.membership
        if membership is None:
            return
        if self.keyring is not None:
            try:
                opened = self.keyring.open_stamped(data)
            except SealError as exc:
                self._reject(peer, exc)
                return
            stale = self._replays.check(opened.nonce, opened.sealed_at, self.clock.time())
            if stale is not None:
                self._reject(peer, SealError(stale))
                return
            data = opened.data
        try:
            messages = decode(data)
        except CodecError as exc:
            self.stats.malformed += 1
            self._warn_once(peer, f"malformed packet from {peer} dropped: {exc}")
            return
        try:
            self._dispatch(membership.receive(messages, self.clock.monotonic(), reliable=reliable))
        except Exception:
            self.stats.malformed += 1
            log.exception("gossip %s: packet from %s not handled", self.name, peer)
        self._wake.set()

    def _reject(self, peer: str, exc: SealError) -> None:
        """Drop and count a packet that does not open."""
        self.stats.rejected += 1
        self._warn_once(peer, f"packet from {peer} dropped: {exc}")

    def _warn_once(self, peer: str, message: str) -> None:
        """Log a bad packet once per sending host (whatever its port: each reliable
        frame comes from a new one), for the first ``LOGGED_HOSTS`` hosts; the rest
        only count — a flood of forgeries must not flood the log."""
        host = peer.rpartition(":")[0] or peer
        if host in self._logged_from or len(self._logged_from) > LOGGED_HOSTS:
            return
        self._logged_from.add(host)
        if len(self._logged_from) > LOGGED_HOSTS:
            log.warning("gossip %s: bad packets from more than %d hosts: further ones are "
                        "only counted", self.name, LOGGED_HOSTS)  # fmt: skip
            return
        log.warning("gossip %s: %s (further ones from this host are only counted)",
                    self.name, message)  # fmt: skip

    def _dispatch(self, sends: list[Send]) -> None:
        membership = self.membership
        if membership is not None and self.on_change is not None:
            changes = membership.drain_changes()
            if changes:
                self.on_change(changes)
        for send in sends:
            try:
                host, port = split_addr(send.to)
            except ValueError as exc:
                log.warning("gossip %s: %s", self.name, exc)
                continue
            payload = encode(send.messages)
            if self.keyring is not None:
                payload = self.keyring.seal(payload, at=self.clock.time())
            if send.reliable:
                task = asyncio.get_running_loop().create_task(
                    self._send_reliable(host, port, payload)
                )
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
            elif self._udp is not None:
                self.stats.datagrams_out += 1
                self._udp.sendto(payload, (host, port))

    async def _send_reliable(self, host: str, port: int, payload: bytes) -> None:
        self.stats.reliable_out += 1
        try:
            async with asyncio.timeout(TCP_TIMEOUT):
                _, writer = await asyncio.open_connection(host, port)
                writer.write(struct.pack(">I", len(payload)) + payload)
                await writer.drain()
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        except (OSError, TimeoutError) as exc:
            self.stats.send_errors += 1
            log.debug("gossip %s: reliable send to %s:%d failed: %s", self.name, host, port, exc)

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        address = writer.get_extra_info("peername") or ("?", 0)
        peer = f"{address[0]}:{address[1]}"
        try:
            async with asyncio.timeout(TCP_TIMEOUT):
                (length,) = struct.unpack(">I", await reader.readexactly(4))
                if length > MAX_PACKET + OVERHEAD:
                    raise CodecError(f"frame of {length} bytes")
                data = await reader.readexactly(length)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, CodecError) as exc:
            self.stats.malformed += 1
            self._warn_once(peer, f"bad reliable frame from {peer}: {exc}")
            return
        finally:
            writer.close()
        self.stats.reliable_in += 1
        self.received(data, peer, reliable=True)


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, service: GossipService) -> None:
        self.service = service

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        self.service.stats.datagrams_in += 1
        self.service.received(data, f"{addr[0]}:{addr[1]}", reliable=False)

    def error_received(self, exc: Exception) -> None:  # e.g. ICMP port unreachable
        log.debug("gossip %s: %s", self.service.name, exc)
