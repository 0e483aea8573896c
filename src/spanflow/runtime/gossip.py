"""The agent's membership endpoint: SWIM over UDP on a thread and event loop of its own.

Acks must go out within the probe timeout (75 ms on the LAN profile) however busy the
agent is (starting a Spark query holds its main thread for seconds; its NATS loop
publishes activity and usage), so membership gets a loop nobody else uses. The
agent talks to it through thread-safe calls: bind (before registering, so the address
can be registered), start with the seeds the coordinator names, set the load, read
the view for heartbeats, leave.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from spanflow.errors import SecurityError
from spanflow.protocol.messages import PeerView
from spanflow.runtime.membership.config import MembershipConfig
from spanflow.runtime.membership.messages import State
from spanflow.runtime.membership.protocol import Change
from spanflow.runtime.membership.udp import GossipService
from spanflow.security.keyring import Keyring

log = logging.getLogger(__name__)

T = TypeVar("T")
CONNECTION_CHECK = 0.2
KEYRING_CHECK = 2.0
STATE_NAMES = {
    State.ALIVE: "alive",
    State.SUSPECT: "suspect",
    State.DEAD: "dead",
    State.LEFT: "left",
}


class AgentGossip:
    def __init__(
        self,
        name: str,
        *,
        bind: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        on_verdict: Callable[[list[Change]], None] | None = None,
        connected: Callable[[], bool] | None = None,
        keyring_file: Path | None = None,
    ) -> None:
        self.name = name
        self._keyring_file = keyring_file
        self._keyring_mtime = 0.0
        self._on_verdict = on_verdict
        self._connected = connected
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gossip", daemon=True)
        self.service = GossipService(
            name,
            bind=bind,
            port=port,
            advertise=advertise,
            on_change=self._changed,
            keyring=self._read_keyring(),
        )
        self.started = False

    @property
    def addr(self) -> str:
        return self.service.addr

    def bind(self) -> str:
        """Open the sockets; the address to register."""
        self._thread.start()
        self._call(self.service.bind())
        return self.addr

    def start(self, profile: str, seeds: list[str]) -> None:
        """Start the protocol with ``profile``'s settings and join ``seeds``."""
        if self.started:
            self.join(seeds)
            return
        self.service.config = MembershipConfig.named(profile)
        self._call(self.service.start(seeds))
        self.started = True
        if self._connected is not None:
            self._loop.call_soon_threadsafe(self._watch_connection)
        if self._keyring_file is not None:
            self._loop.call_soon_threadsafe(self._watch_keyring)

    def _read_keyring(self) -> Keyring | None:
        if self._keyring_file is None:
            return None
        self._keyring_mtime = self._keyring_file.stat().st_mtime
        return Keyring.load(self._keyring_file)

    def _watch_keyring(self) -> None:
        """Every few seconds, pick up a rotated keyring file (``spanflow secrets
        gossip-key``): keys change without restarting the agent. A bad file keeps the
        old ring and says why."""
        assert self._keyring_file is not None
        try:
            if self._keyring_file.stat().st_mtime != self._keyring_mtime:
                self.service.keyring = self._read_keyring()
                log.info("gossip %s: keyring reloaded from %s", self.name, self._keyring_file)
        except (OSError, SecurityError) as exc:
            log.warning("gossip %s: keyring not reloaded: %s", self.name, exc)
        self._loop.call_later(KEYRING_CHECK, self._watch_keyring)

    def _watch_connection(self) -> None:
        """Every 0.2 s, put the data path's state in what this node gossips: a lost NATS
        connection is known to the partition within a probe or two, without waiting for
        the next load report (the agent's heartbeat loop may be stuck on it)."""
        membership = self.service.membership
        if membership is not None and self._connected is not None:
            membership.set_connected(self._connected())
        self._loop.call_later(CONNECTION_CHECK, self._watch_connection)

    def join(self, seeds: list[str]) -> None:
        if seeds:
            self._loop.call_soon_threadsafe(self.service.join, seeds)

    def set_load(self, score: float, free_slots: int, connected: bool = True) -> None:
        """This node's load, free slots and whether its data path (NATS) is up."""
        self._loop.call_soon_threadsafe(self.service.set_load, score, free_slots, connected)

    def view(self) -> dict[str, PeerView]:
        """The other members as this node sees them (for its heartbeat)."""
        if not self.started:
            return {}
        return self._call(self._view())

    async def aview(self) -> dict[str, PeerView]:
        """:meth:`view` for a caller on another event loop (does not block it)."""
        if not self.started:
            return {}
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._view(), self._loop))

    async def _view(self) -> dict[str, PeerView]:
        membership = self.service.membership
        if membership is None:
            return {}
        now = self.service.clock.monotonic()
        out: dict[str, PeerView] = {}
        for m in membership.members.values():
            if m.name == self.name:
                continue
            out[m.name] = PeerView(
                state=STATE_NAMES[m.state],  # type: ignore[arg-type]
                incarnation=m.incarnation,
                since_s=round(now - m.since, 3),
                heard_s=None if m.heard_at == float("-inf") else round(now - m.heard_at, 3),
                load=None if m.load is None else m.load.score,
                free_slots=None if m.load is None else m.load.free_slots,
                load_age_s=None if m.load is None else round(now - m.load_at, 3),
                connected=None if m.load is None else m.load.connected,
            )
        return out

    def close(self, *, leave: bool = True) -> None:
        """Leave the group (unless the agent is crashing on purpose) and stop the loop."""
        if not self._thread.is_alive():
            return
        try:
            if leave and self.started:
                self._call(self.service.leave(), timeout=5.0)
            self._call(self.service.close(), timeout=5.0)
        except Exception as exc:
            log.warning("gossip did not close cleanly: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)

    def _changed(self, changes: list[Change]) -> None:
        for change in changes:
            log.info(
                "gossip: %s is %s (incarnation %d)",
                change.node,
                STATE_NAMES[change.state],
                change.incarnation,
            )
        if self._on_verdict is not None:
            self._on_verdict(changes)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)
