"""Refusing gossip packets recorded and sent again: pure, with the time passed in.

A sealed packet carries when it was sealed and a random nonce, both under the
encryption (spanflow.security.keyring). A receiver keeps the nonces it accepted within
``window`` seconds and refuses a packet sealed longer ago (or further ahead) than that,
or whose nonce it has seen: a replayed "suspect" or "dead" message cannot be used to
make a healthy member look failing.

``window``: 120 s, well above a SWIM round trip and above the clock skew of hosts kept
by NTP (the refusal says to check the clocks when the gap is large); the memory it
takes is the packets of two minutes, bounded by ``max_entries``.

>>> guard = ReplayGuard(window=10)
>>> guard.check(b"n1", sealed_at=100.0, now=100.5) is None
True
>>> print(guard.check(b"n1", sealed_at=100.0, now=101.0))
replayed (a nonce seen 0.5 s ago)
>>> print(guard.check(b"n2", sealed_at=80.0, now=101.0))
sealed 21 s ago, outside the 10 s window (replayed, or this host's clock is off)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class ReplayGuard:
    window: float = 120.0
    max_entries: int = 200_000
    _seen: OrderedDict[bytes, float] = field(default_factory=OrderedDict, repr=False)

    def check(self, nonce: bytes, sealed_at: float, now: float) -> str | None:
        """None if the packet is fresh (and remember it), else why it is refused."""
        age = now - sealed_at
        if abs(age) > self.window:
            when = f"{age:.0f} s ago" if age > 0 else f"{-age:.0f} s ahead"
            return (
                f"sealed {when}, outside the {self.window:.0f} s window (replayed, or this "
                "host's clock is off)"
            )
        self._expire(now)
        seen = self._seen.get(nonce)
        if seen is not None:
            return f"replayed (a nonce seen {now - seen:.1f} s ago)"
        self._seen[nonce] = now
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)
        return None

    def _expire(self, now: float) -> None:
        while self._seen:
            nonce, seen = next(iter(self._seen.items()))
            if seen >= now - self.window:
                return
            del self._seen[nonce]
