"""When an overloaded node sheds a fragment, which one, and to which peer. Pure.

The node's load score (``runtime/load.py``) must stay above ``high`` for ``sustain``
seconds before anything moves (a burst is not an overload), and nothing moves again
for ``cooldown`` seconds after a request. The fragment is the lowest-priority one
(then the biggest share of the load, which relieves the most); the peer is the
least-loaded one the node knows of from gossip — alive, with a load report younger
than ``peer_load_max_age``, the free slots the fragment takes (one, plus one per
Python stateful step), and room: its load plus the fragment's share must stay under
``low``. ``low < high`` is the hysteresis that keeps work from
ping-ponging: a node that takes a fragment ends below ``low``, well short of the
``high`` at which it would shed it back.

The coordinator has the last word (capabilities, the pipeline's latency budget over
the topology's links, fencing); a refusal is remembered for that fragment and peer
for ``refusal_memory``, so the next attempt tries something else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spanflow.runtime.load import FragmentLoad


@dataclass(frozen=True)
class SheddingConfig:
    enabled: bool = True
    high: float = 0.9
    """Load score above which a node is overloaded (1 = at capacity)."""
    low: float = 0.6
    """A peer may take a fragment only if its load stays below this afterwards."""
    sustain: float = 10.0
    """Seconds above ``high`` before shedding: a burst is not an overload."""
    cooldown: float = 30.0
    """Seconds after a request (answered or refused) before the next one: the moved
    fragment's new node needs time to show its new load."""
    peer_load_max_age: float = 5.0
    """A peer's gossiped load older than this is not trusted."""
    refusal_memory: float = 300.0
    """Seconds a refused (fragment, peer) pair is not asked again: a refusal is
    usually structural (capabilities, the latency budget over the peer's links)."""


@dataclass(frozen=True)
class Running:
    """A fragment this node runs, as the policy needs it."""

    fragment: str
    priority: int
    latency_budget: float | None
    load: FragmentLoad | None = None
    slots: int = 1
    """Fragment slots it takes (Python stateful steps count); a peer needs that many free."""


@dataclass(frozen=True)
class PeerLoad:
    name: str
    load: float
    free_slots: int
    load_age: float


@dataclass(frozen=True)
class ShedDecision:
    fragment: str
    to: str
    load: float
    peer_load: float
    share: float
    reason: str


@dataclass
class Shedder:
    config: SheddingConfig = field(default_factory=SheddingConfig)
    _over_since: float | None = None
    _quiet_until: float = float("-inf")
    _refused: dict[tuple[str, str], float] = field(default_factory=dict)

    def observe(
        self, now: float, load: float, running: list[Running], peers: list[PeerLoad]
    ) -> ShedDecision | None:
        """A request to send now, or None."""
        config = self.config
        if not config.enabled or not running:
            self._over_since = None
            return None
        if load <= config.high:
            self._over_since = None
            return None
        if self._over_since is None:
            self._over_since = now
        if now - self._over_since < config.sustain or now < self._quiet_until:
            return None
        shares = _shares(load, running)
        candidates = [
            p for p in peers if p.load_age <= config.peer_load_max_age and p.free_slots > 0
        ]
        for fragment in sorted(
            running, key=lambda f: (f.priority, -shares[f.fragment], f.fragment)
        ):
            share = shares[fragment.fragment]
            for peer in sorted(candidates, key=lambda p: (p.load, p.name)):
                if peer.free_slots < fragment.slots:
                    continue
                if self._refused.get((fragment.fragment, peer.name), float("-inf")) > now:
                    continue
                if peer.load + share >= config.low:
                    break  # peers are sorted: nobody else has room for this one
                return ShedDecision(
                    fragment.fragment,
                    peer.name,
                    load,
                    peer.load,
                    share,
                    f"load {load:.2f} above {config.high:.2f} for "
                    f"{now - self._over_since:.0f} s; {peer.name} at {peer.load:.2f}",
                )
        return None

    def sent(self, now: float) -> None:
        """A request went out (accepted or not): keep quiet for the cool-down."""
        self._quiet_until = now + self.config.cooldown
        self._over_since = None

    def refused(self, request: ShedDecision, now: float) -> None:
        """The coordinator refused it: do not ask that peer for that fragment again
        for ``refusal_memory`` seconds."""
        self._refused[(request.fragment, request.to)] = now + self.config.refusal_memory
        self._refused = {k: v for k, v in self._refused.items() if v > now}
        self.sent(now)


def _shares(load: float, running: list[Running]) -> dict[str, float]:
    """What each fragment would add to a peer's load: its part of this node's capacity
    (batch times when the fragments report them, else an equal split). Capacity, not
    the score: on an overloaded node (score 3) a fragment taking half the batch time
    needs half a node elsewhere, not 1.5 nodes."""
    used = min(load, 1.0)
    times = {f.fragment: (f.load.batch_ms if f.load is not None else 0) for f in running}
    total = sum(times.values())
    if total <= 0:
        return {f.fragment: used / len(running) for f in running}
    return {name: used * t / total for name, t in times.items()}
