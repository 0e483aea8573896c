"""Membership settings, with three profiles and the reasoning behind every default.

The protocol is SWIM (probe, indirect probe, suspect, dead) with HashiCorp
memberlist's refinements and Lifeguard's. Its figures trade three things against each
other: how fast a dead member is declared dead, how rarely a live one is (false
positives under loss or a slow member), and how much traffic the group makes. Pick a
profile and change single fields with :meth:`MembershipConfig.replace`.

How long detection takes, roughly: a dead member is probed by someone within one
probe interval (every member probes one member per interval, so with ``n`` prober
the chance that nobody picks it is ``(1 - 1/n)^n`` ≈ 37 % per interval), the probe
fails after ``probe_interval`` (direct ``probe_timeout``, then indirect probes), and
the suspicion runs out after between ``min`` and ``max``::

    min = suspicion_mult x max(1, log10(n)) x probe_interval
    max = suspicion_max_timeout_mult x min

With Lifeguard a suspicion starts at ``max`` and shrinks towards ``min`` as other
members independently confirm it (``suspicion_mult - 2`` confirmations reach ``min``),
so one member with a bad network cannot declare anyone dead quickly on its own but a
real failure, which every prober sees, is declared at ``min``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

Profile = Literal["lan", "wan", "local_test"]


@dataclass(frozen=True)
class MembershipConfig:
    """Every knob of the protocol (seconds for times)."""

    profile: str = "lan"

    probe_interval: float = 0.15
    """How often a member probes one other member. The failure detector's clock: every
    detection time scales with it. 150 ms costs each member ~13 small packets a second
    (a ping and an ack each way) - nothing on a LAN - and makes a dead member declared
    dead in under 2 s even in a group of 1,000 (benchmarks/membership_sim.py).
    memberlist uses 1 s for clusters of thousands across racks; a site is smaller and
    its members are close, so it can afford faster."""

    probe_timeout: float = 0.075
    """How long to wait for a direct ack before asking others to probe (indirect
    probes). Must be above the network's round trip time at its 99.9th percentile
    (LAN: well under 10 ms) plus scheduling delay on a loaded edge box (an agent runs
    Spark next to it: tens of ms). Not scaled by Lifeguard: the indirect probes and
    their nacks tell a slow network from a slow self."""

    indirect_checks: int = 3
    """Members asked to probe the target when the direct probe fails. With packet loss
    ``p`` every indirect path loses a message with probability ``1-(1-p)^4``; three
    independent paths make a false failure at 5 % loss ≈ 0.6 % of failed direct probes
    (before the reliable fallback and the suspicion's refutation window)."""

    reliable_ping: bool = True
    """Also try a ping over the reliable (TCP) channel when the direct probe fails —
    memberlist's fallback: UDP loss alone then never makes a suspicion, only a member
    that cannot answer at all."""

    retransmit_mult: int = 4
    """Each piggybacked update is sent ``retransmit_mult x ceil(log10(n + 1))`` times.
    Epidemic spread with fan-out ``gossip_nodes`` reaches everyone in ~log(n) rounds;
    the multiplier leaves room for loss (the chance that an update is never received by
    a member falls exponentially in it)."""

    suspicion_mult: int = 3
    """Scales the suspicion timeout (see the module docstring): the window in which a
    suspected member can hear of it and refute. 3 x 150 ms = 0.45 s at <= 10 members,
    0.9 s at 100, 1.35 s at 1,000 - several gossip rounds, and the prober tells the
    suspect directly (Lifeguard's buddy system), so a live member refutes in time. With
    Lifeguard ``suspicion_mult - 2`` = 1 independent confirmation brings a suspicion
    down to this minimum; alone, one member needs the maximum."""

    suspicion_max_timeout_mult: int = 6
    """Lifeguard: a suspicion without independent confirmations lasts up to this many
    times the minimum. One lossy or overloaded member alone needs this long to declare
    a peer dead; a real failure gets confirmations and finishes at ``min``."""

    gossip_interval: float = 0.1
    """How often queued updates are sent to ``gossip_nodes`` random members (only when
    there is something to send). Faster spreads verdicts faster at more packets; a
    dead verdict reaches 1,000 members in ~log4(1000) ≈ 5 rounds."""

    gossip_nodes: int = 3
    """Fan-out of each gossip round. 3 is SWIM's and memberlist's choice: more adds
    traffic for little speed once updates also ride on probes."""

    gossip_to_the_dead: float = 15.0
    """Keep gossiping to a member declared dead for this long, so that a member that
    was wrongly declared dead (a partition, a long pause) learns it and refutes by
    rejoining with a higher incarnation."""

    push_pull_interval: float = 15.0
    """Full state exchange with one random member over the reliable channel: repairs
    what gossip missed (a long partition, updates that ran out of retransmits). Scaled
    up above 32 members (memberlist's rule) so the cluster's total is bounded."""

    reconnect_interval: float = 2.0
    """Every so often (x max(1, log10(n))) push-pull with one member this member holds
    dead, or a seed it does not see alive: after a partition heals, each side holds
    the other dead and nothing else would cross (probes skip the dead, push-pull picks
    live members) - Serf's reconnect, built in. A dead process costs one refused TCP
    connection per attempt."""

    awareness_max_multiplier: int = 8
    """Lifeguard local health: a member that misses acks, gets no nacks from its
    helpers or has to refute a suspicion of itself is probably the slow one; it scales
    its probe interval by up to this factor (score 0…max-1, timeout x (score + 1)) so a
    CPU-starved member stops accusing healthy peers."""

    lifeguard: bool = True
    """Lifeguard's three refinements: local health awareness, dynamic suspicion
    (confirmations shorten it) and nacks from indirect helpers, plus the "buddy
    system" (a suspected member is told so in the probe). Off = classic SWIM: a fixed
    suspicion timeout of ``min``, no nacks, no self-awareness."""

    packet_budget: int = 1400
    """Bytes in one UDP datagram: below the usual 1,500-byte Ethernet MTU after IP and
    UDP headers, so a gossip packet is never fragmented (a lost fragment loses all)."""

    dead_reclaim: float = 0.0
    """A name declared dead may rejoin at once from a new address (a restarted agent
    on another port). memberlist's default: no wait."""

    leave_propagation: float = 0.5
    """On a graceful leave, how long to keep gossiping the "left" verdict before going
    quiet: a few gossip rounds so peers stop probing at once instead of suspecting."""

    def replace(self, **changes: Any) -> MembershipConfig:
        """A copy with some fields changed (unknown names are an error)."""
        return dataclasses.replace(self, **changes)

    def suspicion_min(self, members: int) -> float:
        """The shortest suspicion for a group of ``members`` (memberlist's formula)."""
        scale = max(1.0, math.log10(max(1.0, float(members))))
        return self.suspicion_mult * scale * self.probe_interval

    def suspicion_max(self, members: int) -> float:
        return self.suspicion_max_timeout_mult * self.suspicion_min(members)

    def retransmit_limit(self, members: int) -> int:
        """How many times each update is piggybacked before it is dropped."""
        return self.retransmit_mult * math.ceil(math.log10(members + 1))

    def reconnect_every(self, members: int) -> float:
        return self.reconnect_interval * max(1.0, math.log10(max(1, members)))

    def push_pull_every(self, members: int) -> float:
        """memberlist's ``pushPullScale``: x1 up to 32 members, then one more interval per
        doubling, so a big group's total exchange rate stays bounded."""
        threshold = 32
        if members <= threshold:
            return self.push_pull_interval
        factor = math.ceil(math.log2(members) - math.log2(threshold)) + 1
        return self.push_pull_interval * factor

    @classmethod
    def lan(cls) -> MembershipConfig:
        """A site's nodes on one LAN: a dead node known in ~1-2 s (the defaults above)."""
        return cls()

    @classmethod
    def wan(cls) -> MembershipConfig:
        """Members across a WAN (a partition spanning buildings or regions): round trips
        of 50-300 ms and bursts of loss, so every timeout grows and suspicions last
        longer; detection takes tens of seconds, like memberlist's WAN profile."""
        return cls(
            profile="wan",
            probe_interval=5.0,
            probe_timeout=3.0,
            suspicion_mult=6,
            gossip_interval=0.5,
            gossip_nodes=4,
            gossip_to_the_dead=60.0,
            push_pull_interval=60.0,
            reconnect_interval=30.0,
        )

    @classmethod
    def local_test(cls) -> MembershipConfig:
        """Members on one machine in tests: loopback never loses packets, so fewer
        helpers and retransmits, short timeouts; fast and still correct."""
        return cls(
            profile="local_test",
            probe_interval=0.1,
            probe_timeout=0.05,
            indirect_checks=1,
            retransmit_mult=2,
            suspicion_mult=3,
            gossip_interval=0.05,
            gossip_to_the_dead=5.0,
            push_pull_interval=5.0,
            reconnect_interval=1.0,
        )

    @classmethod
    def named(cls, profile: str) -> MembershipConfig:
        """The profile called ``profile``; a clear error for an unknown name."""
        makers = {"lan": cls.lan, "wan": cls.wan, "local_test": cls.local_test}
        if profile not in makers:
            known = ", ".join(sorted(makers))
            raise ValueError(f"unknown membership profile {profile!r} (known: {known})")
        return makers[profile]()
