"""A simulated network for the membership protocol: loss, delay, partitions, slow members.

Discrete-event: a heap of deliveries and wake-ups in simulated seconds, so a thousand
members over a minute run in seconds of real time and every run is reproducible from
its seed. The members are the real :class:`~.protocol.Membership` objects, and with
``wire=True`` every packet goes through the real codec as over UDP.

Datagrams are lost with probability ``loss`` and take ``delay`` (uniform within the
range); the reliable channel (TCP in production) is never lost but is cut by
partitions like everything else. A *slow* member (CPU-starved, a full socket buffer)
has every packet it sends or receives held for extra seconds — the failure Lifeguard
was designed for.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass

from spanflow.runtime.membership.config import MembershipConfig
from spanflow.runtime.membership.messages import Message, decode, encode
from spanflow.runtime.membership.protocol import Change, Membership, Send
from spanflow.security.keyring import Keyring

Observer = Callable[[str, list[Change]], None]


@dataclass
class NetworkStats:
    sent: int = 0
    lost: int = 0
    cut: int = 0
    delivered: int = 0
    bytes: int = 0


@dataclass
class _Node:
    membership: Membership
    wake_at: float = float("inf")
    down: bool = False
    slow: float = 0.0
    group: int = 0


_WAKE = 0
_DELIVER = 1
_Event = tuple[float, int, int, str, "tuple[Message, ...] | bytes", bool]
"""(at, order, kind, member, messages, reliable): plain tuples keep the heap fast."""


class MemoryNetwork:
    """Members addressed by name, joined by a simulated network."""

    def __init__(
        self,
        *,
        seed: int = 0,
        loss: float = 0.0,
        delay: tuple[float, float] = (0.0002, 0.002),
        wire: bool = False,
        keyring: Keyring | None = None,
    ) -> None:
        self.now = 0.0
        self.keyring = keyring
        """Seal every packet as sealed gossip does (implies ``wire``): the CPU and the
        bytes are real, so a run says what encryption costs."""
        self.loss = loss
        self.delay = delay
        self.wire = wire or keyring is not None
        self.rng = random.Random(seed)
        self.stats = NetworkStats()
        self.nodes: dict[str, _Node] = {}
        self.observers: list[Observer] = []
        self._events: list[_Event] = []
        self._order = 0

    # ----------------------------------------------------------- membership

    def add(
        self, name: str, config: MembershipConfig, seeds: list[str] | None = None
    ) -> Membership:
        """Start a member now; it joins through ``seeds`` (names) if given."""
        membership = Membership(
            name, name, config, now=self.now, rng=random.Random(self.rng.getrandbits(64))
        )
        self.nodes[name] = _Node(membership)
        self._dispatch(name, membership.join(seeds or [], self.now))
        self._reschedule(name)
        return membership

    def member(self, name: str) -> Membership:
        return self.nodes[name].membership

    def kill(self, name: str) -> None:
        """The process dies: it neither sends nor receives from now on."""
        self.nodes[name].down = True

    def leave(self, name: str) -> None:
        self._dispatch(name, self.nodes[name].membership.leave(self.now))
        self._reschedule(name)

    def set_slow(self, name: str, seconds: float) -> None:
        self.nodes[name].slow = seconds

    def partition(self, *groups: set[str]) -> None:
        """Split the network: members in different groups cannot reach each other
        (members in no group form group 0 together)."""
        for node in self.nodes.values():
            node.group = 0
        for index, group in enumerate(groups, start=1):
            for name in group:
                self.nodes[name].group = index

    def heal(self) -> None:
        self.partition()

    def live(self) -> list[str]:
        return [name for name, node in self.nodes.items() if not node.down]

    # ------------------------------------------------------------------ run

    def run_until(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            at, _, kind, addr, payload, reliable = heapq.heappop(self._events)
            self.now = at
            node = self.nodes[addr]
            if node.down:
                continue
            if kind == _WAKE:
                if at != node.wake_at:
                    continue  # superseded by an earlier wake-up
                node.wake_at = float("inf")
                self._dispatch(addr, node.membership.tick(at))
            else:
                self.stats.delivered += 1
                if isinstance(payload, bytes):
                    data = self.keyring.open(payload) if self.keyring else payload
                    messages = decode(data)
                else:
                    messages = list(payload)
                self._dispatch(addr, node.membership.receive(messages, at, reliable=reliable))
            self._reschedule(addr)
        self.now = max(self.now, until)

    def run_while(self, condition: Callable[[], bool], *, step: float, limit: float) -> bool:
        """Run in ``step`` slices while ``condition()`` holds, up to ``limit`` seconds of
        simulated time; False if it still held at the limit."""
        end = self.now + limit
        while condition():
            if self.now >= end:
                return False
            self.run_until(min(end, self.now + step))
        return True

    def _dispatch(self, source: str, sends: list[Send]) -> None:
        node = self.nodes[source]
        changes = node.membership.drain_changes()
        if changes:
            for observer in self.observers:
                observer(source, changes)
        for send in sends:
            self._transmit(source, send)

    def _transmit(self, source: str, send: Send) -> None:
        self.stats.sent += 1
        target = self.nodes.get(send.to)
        if target is None:
            return
        if target.group != self.nodes[source].group:
            self.stats.cut += 1
            return
        if not send.reliable and self.loss and self.rng.random() < self.loss:
            self.stats.lost += 1
            return
        payload: tuple[Message, ...] | bytes = send.messages
        if self.wire:
            payload = encode(send.messages)
            if self.keyring is not None:
                payload = self.keyring.seal(payload)
            self.stats.bytes += len(payload)
        at = self.now + self.rng.uniform(*self.delay) + self.nodes[source].slow + target.slow
        self._push(at, _DELIVER, send.to, payload, send.reliable)

    def _reschedule(self, name: str) -> None:
        node = self.nodes[name]
        if node.down:
            return
        at = max(self.now, node.membership.next_deadline())
        if at < node.wake_at:
            node.wake_at = at
            self._push(at, _WAKE, name, (), False)

    def _push(
        self, at: float, kind: int, addr: str, payload: tuple[Message, ...] | bytes, reliable: bool
    ) -> None:
        self._order += 1
        heapq.heappush(self._events, (at, self._order, kind, addr, payload, reliable))
