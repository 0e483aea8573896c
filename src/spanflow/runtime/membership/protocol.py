"""SWIM with Lifeguard, as a state machine with no I/O and no clock of its own.

A :class:`Membership` is one member's view of its group. A transport feeds it what
arrives (:meth:`Membership.receive`) and wakes it at :meth:`Membership.next_deadline`
(:meth:`Membership.tick`); both return the packets to send (:class:`Send`). The same
object runs over UDP in an agent (``udp.py``) and over the simulated network of the
benchmark and the tests (``memory_network.py``) — time is always an argument.

The protocol, memberlist's shape:

* **Probe** one member per ``probe_interval`` (round robin over a shuffled list, so
  each member is probed within a bounded time). No ack within ``probe_timeout`` →
  ask ``indirect_checks`` others to probe it (and ping it over the reliable channel);
  no ack by the end of the interval → **suspect** it.
* **Suspect** → a suspicion timer (:mod:`.suspicion`); when it runs out without the
  member refuting, declare it **dead**. Other members' suspicions of the same member
  confirm it and shorten the timer (Lifeguard).
* **Incarnations**: only the member itself raises its incarnation; a member that hears
  it is suspected or dead **refutes** with an ``Alive`` at a higher incarnation, which
  overrides every older verdict.
* **Dissemination**: verdicts are rumours queued with a transmit limit and piggybacked
  on every datagram, plus gossip rounds to ``gossip_nodes`` random members; a periodic
  full **push-pull** exchange over the reliable channel repairs whatever was missed.
* **Join** = push-pull with a seed; **leave** = a ``Dead`` about oneself, gossiped.
* **Lifeguard**: local health (:mod:`.awareness`) stretches this member's probe
  interval when it seems to be the slow one; nacks from indirect helpers tell a slow
  self from a dead target; a suspected member is told so in the probe itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from spanflow.runtime.membership.awareness import Awareness
from spanflow.runtime.membership.broadcasts import BroadcastQueue
from spanflow.runtime.membership.config import MembershipConfig
from spanflow.runtime.membership.messages import (
    Ack,
    Alive,
    Dead,
    IndirectPing,
    Load,
    Message,
    Nack,
    NodeState,
    Ping,
    PushPull,
    Rumour,
    State,
    Suspect,
    encoded_size,
)
from spanflow.runtime.membership.suspicion import Suspicion

_LIVE = {State.ALIVE: 1, State.SUSPECT: 1, State.DEAD: 0, State.LEFT: 0}

SAME_MEASUREMENT = 0.05
"""Load reports whose measurement times differ by less than this (transit jitter) are
the same measurement: the later one is taken (its ``connected`` flag may be newer)."""

LONELY_RETRY = 1.0
"""Seconds between attempts to reach the seeds while this member knows nobody."""


@dataclass(frozen=True)
class Send:
    """A packet for the transport: datagram, or the reliable channel (TCP)."""

    to: str
    messages: tuple[Message, ...]
    reliable: bool = False


@dataclass(frozen=True)
class Change:
    """A member changed state in this member's view (what the agent reports)."""

    at: float
    node: str
    state: State
    incarnation: int


@dataclass
class Member:
    """One member as this member sees it."""

    name: str
    addr: str
    incarnation: int
    state: State
    since: float
    load: Load | None = None
    load_at: float = float("-inf")
    """When ``load`` was measured, on this member's clock."""
    heard_at: float = float("-inf")
    """When it last pinged or acked (directly or through a helper): proof of life
    fresher than its state, which only changes on failure."""


@dataclass
class _Probe:
    seq: int
    target: str
    indirect_at: float
    end: float
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass
class _Relay:
    origin_seq: int
    origin_addr: str
    deadline: float
    nack: bool


@dataclass
class _Suspicion:
    timer: Suspicion
    incarnation: int


@dataclass
class Counters:
    """What happened, for metrics and the simulator."""

    probes: int = 0
    probe_failures: int = 0
    indirect_probes: int = 0
    refutations: int = 0
    suspicions: int = 0
    declared_dead: int = 0
    push_pulls: int = 0
    gossip_packets: int = 0
    ignored: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class Membership:
    """One member's SWIM state machine."""

    def __init__(
        self,
        name: str,
        addr: str,
        config: MembershipConfig,
        *,
        now: float,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.rng = rng or random.Random()
        self.me = Member(name, addr, incarnation=1, state=State.ALIVE, since=now)
        self.members: dict[str, Member] = {name: self.me}
        self.awareness = Awareness(config.awareness_max_multiplier)
        self.counters = Counters()
        self.changes: list[Change] = []
        self.leaving = False
        self._names: list[str] = [name]
        self._live = 1
        self._probe_order: list[str] = []
        self._probe_index = 0
        self._seq = 0
        self._probes: dict[int, _Probe] = {}
        self._relays: dict[int, _Relay] = {}
        self._suspicions: dict[str, _Suspicion] = {}
        self._broadcasts = BroadcastQueue()
        self._seeds: tuple[str, ...] = ()
        self._next_probe = now + self.rng.uniform(0, config.probe_interval)
        self._next_gossip = now + self.rng.uniform(0, config.gossip_interval)
        self._next_push_pull = now + self.rng.uniform(0.5, 1.0) * config.push_pull_interval
        self._next_reconnect = now + self.rng.uniform(0.5, 1.5) * config.reconnect_interval
        self._dead: set[str] = set()
        """Members held dead (not left): candidates for a reconnect attempt."""

    # ----------------------------------------------------------------- views

    @property
    def name(self) -> str:
        return self.me.name

    def state_of(self, name: str) -> State | None:
        member = self.members.get(name)
        return None if member is None else member.state

    def alive(self) -> list[Member]:
        """Members this member believes alive (itself included)."""
        return [m for m in self.members.values() if m.state == State.ALIVE]

    def live_count(self) -> int:
        """Members alive or suspected (the group size every formula scales with)."""
        return self._live

    def drain_changes(self) -> list[Change]:
        changes, self.changes = self.changes, []
        return changes

    def set_connected(self, connected: bool) -> None:
        """Whether this member's data path is up, between two load reports (it travels
        with the load)."""
        if self.me.load is not None and self.me.load.connected != connected:
            self.me.load = replace(self.me.load, connected=connected)

    def set_load(
        self, score: float, free_slots: int, now: float, *, connected: bool = True
    ) -> None:
        """This member's own latest load (sent on every ping and ack)."""
        self.me.load = Load(round(score, 3), free_slots, 0.0, connected)
        self.me.load_at = now

    # ------------------------------------------------------------ lifecycle

    def join(self, seeds: list[str] | tuple[str, ...], now: float) -> list[Send]:
        """Push-pull with every seed (addresses); retried while nobody is known."""
        self._seeds = tuple(s for s in seeds if s != self.me.addr)
        self._next_push_pull = now + LONELY_RETRY
        return [self._push_pull(seed, now, join=True) for seed in self._seeds]

    def leave(self, now: float) -> list[Send]:
        """Tell the group this member is leaving (gossiped for ``leave_propagation``)."""
        self.leaving = True
        self._on_dead(Dead(self.me.incarnation, self.name, self.name), now)
        return self._gossip(now, force=True)

    # ---------------------------------------------------------------- timers

    def next_deadline(self) -> float:
        deadlines = [self._next_gossip]
        if not self.leaving:
            deadlines += [self._next_probe, self._next_push_pull, self._next_reconnect]
        deadlines += [p.end if p.indirect_sent else p.indirect_at for p in self._probes.values()]
        deadlines += [r.deadline for r in self._relays.values()]
        deadlines += [s.timer.deadline for s in self._suspicions.values()]
        return min(deadlines)

    def tick(self, now: float) -> list[Send]:
        """Run everything due at ``now``."""
        out: list[Send] = []
        out += self._advance_probes(now)
        out += self._expire_relays(now)
        self._expire_suspicions(now)
        if not self.leaving:
            if now >= self._next_probe:
                out += self._start_probe(now)
            if now >= self._next_push_pull:
                out += self._push_pull_round(now)
            if now >= self._next_reconnect:
                out += self._reconnect(now)
        if now >= self._next_gossip:
            out += self._gossip(now)
        return out

    # --------------------------------------------------------------- receive

    def receive(self, messages: list[Message], now: float, *, reliable: bool = False) -> list[Send]:
        """Handle one packet's messages; returns the replies."""
        out: list[Send] = []
        for message in messages:
            out += self._handle(message, now, reliable)
        return out

    def _handle(self, message: Message, now: float, reliable: bool) -> list[Send]:
        match message:
            case Ping():
                return self._on_ping(message, now, reliable)
            case IndirectPing():
                return self._on_indirect_ping(message, now)
            case Ack():
                return self._on_ack(message, now)
            case Nack():
                probe = self._probes.get(message.seq)
                if probe is not None:
                    probe.nacks += 1
                return []
            case Alive():
                self._on_alive(message, now)
            case Suspect():
                self._on_suspect(message, now)
            case Dead():
                self._on_dead(message, now)
            case PushPull():
                return self._on_push_pull(message, now)
        return []

    def _on_ping(self, ping: Ping, now: float, reliable: bool) -> list[Send]:
        if ping.target != self.name:
            self.counters.ignored += 1  # meant for a previous owner of this address
            return []
        self._note_load(ping.source, ping.load, now)
        self._heard(ping.source, now)
        ack = Ack(ping.seq, self.name, self._own_load(now))
        return [self._send(ping.source_addr, [ack], reliable=reliable)]

    def _on_indirect_ping(self, request: IndirectPing, now: float) -> list[Send]:
        seq = self._next_seq()
        self._relays[seq] = _Relay(
            request.seq, request.source_addr, now + self.config.probe_timeout, request.nack
        )
        ping = Ping(seq, request.target, self.name, self.me.addr, self._own_load(now))
        return [self._send(request.target_addr, [ping])]

    def _on_ack(self, ack: Ack, now: float) -> list[Send]:
        self._note_load(ack.source, ack.load, now)
        self._heard(ack.source, now)
        relay = self._relays.pop(ack.seq, None)
        if relay is not None:
            return [self._send(relay.origin_addr, [Ack(relay.origin_seq, ack.source, ack.load)])]
        probe = self._probes.pop(ack.seq, None)
        if probe is not None and self.config.lifeguard:
            self.awareness.apply(-1)
        return []

    def _on_push_pull(self, exchange: PushPull, now: float) -> list[Send]:
        self.counters.push_pulls += 1
        for state in exchange.states:
            self._merge(state, exchange.source, now)
        if exchange.reply:
            return []
        return [self._push_pull(exchange.source_addr, now, join=False, reply=True)]

    # ------------------------------------------------------- state changes

    def _on_alive(self, alive: Alive, now: float) -> None:
        member = self.members.get(alive.node)
        if alive.node == self.name:
            self._on_alive_about_me(alive)
            return
        if member is None:
            self._add(alive, now)
            return
        moved = alive.addr != member.addr
        if moved and not (
            member.state in (State.DEAD, State.LEFT)
            and now - member.since >= self.config.dead_reclaim
        ):
            self.counters.ignored += 1  # two live processes claim one name: keep the first
            return
        if alive.incarnation <= member.incarnation and not moved:
            return
        self._suspicions.pop(alive.node, None)
        member.incarnation = alive.incarnation
        member.addr = alive.addr
        if member.state != State.ALIVE:
            self._set_state(member, State.ALIVE, now)
        self._broadcasts.push(alive)

    def _on_alive_about_me(self, alive: Alive) -> None:
        if alive.incarnation < self.me.incarnation:
            return
        if alive.incarnation == self.me.incarnation and alive.addr == self.me.addr:
            return  # our own rumour coming back
        if not self.leaving:
            self._refute(alive.incarnation)

    def _on_suspect(self, suspect: Suspect, now: float) -> None:
        member = self.members.get(suspect.node)
        if member is None or suspect.incarnation < member.incarnation:
            return
        existing = self._suspicions.get(suspect.node)
        if existing is not None:
            if existing.timer.confirm(suspect.sender):
                self._broadcasts.push(suspect)
            return
        if member.state != State.ALIVE:
            return
        if suspect.node == self.name:
            if not self.leaving:
                self._refute(suspect.incarnation)
            return
        self._broadcasts.push(suspect)
        self.counters.suspicions += 1
        member.incarnation = suspect.incarnation
        self._set_state(member, State.SUSPECT, now)
        self._suspicions[suspect.node] = _Suspicion(
            self._new_timer(suspect.sender, now), suspect.incarnation
        )

    def _new_timer(self, accuser: str, now: float) -> Suspicion:
        members = self.live_count()
        minimum = self.config.suspicion_min(members)
        if not self.config.lifeguard:
            return Suspicion(accuser, 0, minimum, minimum, now)
        expected = self.config.suspicion_mult - 2
        if members - 2 < expected:
            expected = 0
        return Suspicion(accuser, expected, minimum, self.config.suspicion_max(members), now)

    def _on_dead(self, dead: Dead, now: float) -> None:
        member = self.members.get(dead.node)
        if member is None or dead.incarnation < member.incarnation:
            return
        self._suspicions.pop(dead.node, None)
        if member.state in (State.DEAD, State.LEFT):
            return
        if dead.node == self.name and not self.leaving:
            self._refute(dead.incarnation)
            return
        self._broadcasts.push(dead)
        member.incarnation = dead.incarnation
        left = dead.node == dead.sender
        if not left:
            self.counters.declared_dead += 1
        self._set_state(member, State.LEFT if left else State.DEAD, now)

    def _refute(self, accused_incarnation: int) -> None:
        """Someone thinks this member is not alive: out-vote it with a higher incarnation."""
        self.counters.refutations += 1
        self.me.incarnation = max(self.me.incarnation, accused_incarnation) + 1
        self._broadcasts.push(Alive(self.me.incarnation, self.name, self.me.addr))
        if self.config.lifeguard:
            self.awareness.apply(1)

    def _merge(self, state: NodeState, source: str, now: float) -> None:
        """A push-pull entry. Remote "dead" becomes a local suspicion (memberlist's rule):
        our own probes then decide, and a wrongly accused member gets time to refute."""
        match state.state:
            case State.ALIVE:
                self._on_alive(Alive(state.incarnation, state.name, state.addr), now)
            case State.LEFT:
                self._on_dead(Dead(state.incarnation, state.name, state.name), now)
            case _:
                self._on_suspect(Suspect(state.incarnation, state.name, source), now)
        self._note_load(state.name, state.load, now)

    def _add(self, alive: Alive, now: float) -> None:
        member = Member(alive.node, alive.addr, alive.incarnation, State.ALIVE, now)
        self.members[alive.node] = member
        self._names.append(alive.node)
        self._live += 1
        position = self.rng.randint(self._probe_index, len(self._probe_order))
        self._probe_order.insert(position, alive.node)
        self.changes.append(Change(now, alive.node, State.ALIVE, alive.incarnation))
        self._broadcasts.push(alive)

    def _set_state(self, member: Member, state: State, now: float) -> None:
        self._live += _LIVE[state] - _LIVE[member.state]
        if state == State.DEAD:
            self._dead.add(member.name)
        else:
            self._dead.discard(member.name)
        member.state = state
        member.since = now
        self.changes.append(Change(now, member.name, state, member.incarnation))

    def _note_load(self, name: str, load: Load | None, now: float) -> None:
        member = self.members.get(name)
        if load is None or member is None or member is self.me:
            return
        measured_at = now - load.age
        if measured_at > member.load_at - SAME_MEASUREMENT:
            member.load = load
            member.load_at = max(measured_at, member.load_at)

    def _heard(self, name: str, now: float) -> None:
        member = self.members.get(name)
        if member is not None:
            member.heard_at = now

    def _own_load(self, now: float) -> Load | None:
        load = self.me.load
        if load is None:
            return None
        return Load(load.score, load.free_slots, max(0.0, now - self.me.load_at), load.connected)

    # ----------------------------------------------------------------- probe

    def _start_probe(self, now: float) -> list[Send]:
        interval = self.config.probe_interval
        if self.config.lifeguard:
            interval = self.awareness.scale(interval)
        self._next_probe = now + interval
        if self._probes:
            return []  # the previous probe is still running (its interval was stretched)
        target = self._next_target(now)
        if target is None:
            return []
        self.counters.probes += 1
        seq = self._next_seq()
        self._probes[seq] = _Probe(
            seq, target.name, now + self.config.probe_timeout, now + interval
        )
        messages: list[Message] = [
            Ping(seq, target.name, self.name, self.me.addr, self._own_load(now))
        ]
        if self.config.lifeguard and target.state == State.SUSPECT:
            messages.append(Suspect(target.incarnation, target.name, self.name))
        return [self._send(target.addr, messages)]

    def _next_target(self, now: float) -> Member | None:
        for _ in range(len(self._probe_order) + 1):
            if self._probe_index >= len(self._probe_order):
                self._reset_probe_order(now)
                if not self._probe_order:
                    return None
            name = self._probe_order[self._probe_index]
            self._probe_index += 1
            member = self.members.get(name)
            if member is not None and member.state in (State.ALIVE, State.SUSPECT):
                return member
        return None

    def _reset_probe_order(self, now: float) -> None:
        """Start a new round: forget members dead for long enough, shuffle the rest."""
        expired = [
            m.name
            for m in self.members.values()
            if m.state in (State.DEAD, State.LEFT)
            and now - m.since > self.config.gossip_to_the_dead
        ]
        for name in expired:
            del self.members[name]
            self._dead.discard(name)
        if expired:
            self._names = list(self.members)
        self._probe_order = [n for n in self.members if n != self.name]
        self.rng.shuffle(self._probe_order)
        self._probe_index = 0

    def _advance_probes(self, now: float) -> list[Send]:
        out: list[Send] = []
        for probe in list(self._probes.values()):
            if not probe.indirect_sent and now >= probe.indirect_at:
                out += self._indirect(probe, now)
            if probe.indirect_sent and now >= probe.end:
                self._probe_failed(probe, now)
        return out

    def _indirect(self, probe: _Probe, now: float) -> list[Send]:
        probe.indirect_sent = True
        target = self.members.get(probe.target)
        if target is None:
            return []
        self.counters.indirect_probes += 1
        out: list[Send] = []
        for helper in self._sample(
            self.config.indirect_checks, {self.name, target.name}, alive_only=True
        ):
            nack = self.config.lifeguard
            probe.expected_nacks += int(nack)
            request = IndirectPing(
                probe.seq, target.name, target.addr, nack, self.name, self.me.addr
            )
            out.append(self._send(helper.addr, [request]))
        if self.config.reliable_ping:
            ping = Ping(probe.seq, target.name, self.name, self.me.addr, self._own_load(now))
            out.append(Send(target.addr, (ping,), reliable=True))
        return out

    def _probe_failed(self, probe: _Probe, now: float) -> None:
        del self._probes[probe.seq]
        self.counters.probe_failures += 1
        if self.config.lifeguard:
            missing = probe.expected_nacks - probe.nacks
            self.awareness.apply(missing if probe.expected_nacks > 0 else 1)
        target = self.members.get(probe.target)
        if target is not None and target.state in (State.ALIVE, State.SUSPECT):
            self._on_suspect(Suspect(target.incarnation, target.name, self.name), now)

    def _expire_relays(self, now: float) -> list[Send]:
        out: list[Send] = []
        for seq, relay in list(self._relays.items()):
            if now >= relay.deadline:
                del self._relays[seq]
                if relay.nack:
                    out.append(self._send(relay.origin_addr, [Nack(relay.origin_seq)]))
        return out

    def _expire_suspicions(self, now: float) -> None:
        for name, suspicion in list(self._suspicions.items()):
            if now < suspicion.timer.deadline:
                continue
            del self._suspicions[name]
            member = self.members.get(name)
            if (
                member is not None
                and member.state == State.SUSPECT
                and member.incarnation == suspicion.incarnation
            ):
                self._on_dead(Dead(suspicion.incarnation, name, self.name), now)

    # ------------------------------------------------------- dissemination

    def _gossip(self, now: float, *, force: bool = False) -> list[Send]:
        self._next_gossip = now + self.config.gossip_interval
        if not self._broadcasts:
            return []
        out: list[Send] = []
        for peer in self._sample(self.config.gossip_nodes, {self.name}, alive_only=False, now=now):
            rumours = self._broadcasts.take(self.config.packet_budget, self._retransmit_limit())
            if not rumours:
                break
            self.counters.gossip_packets += 1
            out.append(Send(peer.addr, tuple(rumours)))
        return out

    def _send(self, to: str, messages: list[Message], *, reliable: bool = False) -> Send:
        """A packet with as many queued rumours piggybacked as fit the datagram."""
        if not reliable and self._broadcasts:
            room = self.config.packet_budget - sum(encoded_size(m) for m in messages)
            rumours: list[Rumour] = self._broadcasts.take(room, self._retransmit_limit())
            messages = [*messages, *rumours]
        return Send(to, tuple(messages), reliable)

    def _retransmit_limit(self) -> int:
        return self.config.retransmit_limit(self.live_count())

    def _push_pull_round(self, now: float) -> list[Send]:
        others = self._sample(1, {self.name}, alive_only=True)
        if not others:
            self._next_push_pull = now + LONELY_RETRY
            return [self._push_pull(seed, now, join=True) for seed in self._seeds]
        self._next_push_pull = now + self.config.push_pull_every(self.live_count())
        return [self._push_pull(others[0].addr, now, join=False)]

    def _reconnect(self, now: float) -> list[Send]:
        """Push-pull with one member held dead or one seed not seen alive (see
        ``reconnect_interval``): how two sides of a healed partition find each other."""
        self._next_reconnect = now + self.config.reconnect_every(self.live_count())
        alive_addrs = {m.addr for m in self.members.values() if m.state == State.ALIVE}
        candidates = [self.members[n].addr for n in self._dead]
        candidates += [s for s in self._seeds if s not in alive_addrs]
        if not candidates:
            return []
        return [self._push_pull(self.rng.choice(candidates), now, join=False)]

    def _push_pull(self, to: str, now: float, *, join: bool, reply: bool = False) -> Send:
        states = tuple(
            NodeState(
                m.name,
                m.addr,
                m.incarnation,
                int(m.state),
                None if m.load is None else replace(m.load, age=max(0.0, now - m.load_at)),
            )
            for m in self.members.values()
        )
        return Send(to, (PushPull(self.name, self.me.addr, join, reply, states),), reliable=True)

    def _sample(
        self, count: int, exclude: set[str], *, alive_only: bool, now: float = 0.0
    ) -> list[Member]:
        """Up to ``count`` distinct random members (rejection sampling: O(count) in a big
        group, where building the candidate list every round would be O(n))."""
        chosen: dict[str, Member] = {}
        names = self._names
        for _ in range(count * 4 + 8):
            if len(chosen) >= count or not names:
                break
            name = names[self.rng.randrange(len(names))]
            member = self.members.get(name)
            if member is None or name in exclude or name in chosen:
                continue
            if self._eligible(member, alive_only, now):
                chosen[name] = member
        if len(chosen) < count and len(names) <= 64:
            rest = [
                self.members[n]
                for n in names
                if n in self.members
                and n not in exclude
                and n not in chosen
                and self._eligible(self.members[n], alive_only, now)
            ]
            self.rng.shuffle(rest)
            for member in rest[: count - len(chosen)]:
                chosen[member.name] = member
        return list(chosen.values())

    def _eligible(self, member: Member, alive_only: bool, now: float) -> bool:
        if member.state == State.ALIVE:
            return True
        if alive_only:
            return False
        if member.state == State.SUSPECT:
            return True
        return now - member.since <= self.config.gossip_to_the_dead

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq
