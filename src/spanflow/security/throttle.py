"""Login throttling that targets the guesser: pure, with the time passed in.

A key — a source address, a user, a token's first characters — that failed
``failures`` times within ``window`` seconds is locked for ``penalty`` seconds, doubled
at each further lock-out up to ``max_penalty``: a guesser gets a handful of tries a
minute, a device with a stale password keeps logging a clear refusal.

A door asks :meth:`LoginThrottle.may_check` whether a login by ``who`` from ``address``
may be checked, and reports the outcome (:meth:`login_failed`,
:meth:`login_succeeded`). Wrong logins count against the address, against ``who``
(one user guessed from many addresses) and against the pair. Neither lock stops a pair
that has logged in before — the device behind the same NAT address as a guesser, the
user whose name a guesser tries from elsewhere — which only its own failures lock:
a valid login is not refused because others failed from its address or for its name.
A success clears the pair's record only: the address's failures were someone else's.
Where checking is cheap (REST tokens, compared in constant time), the door checks
first and throttles only the wrong ones (:mod:`spanflow.security.limits`).

Defaults: 10 failures a minute is well above what a misconfigured fleet behind one NAT
address produces while someone fixes it, and far below what guessing needs; 30 s
doubling to 15 minutes keeps a loop from burning CPU on password checks.

>>> t = LoginThrottle(failures=2, window=60, penalty=30)
>>> t.allowed("10.0.0.9", now=0.0)
True
>>> t.failed("10.0.0.9", now=1.0); t.failed("10.0.0.9", now=2.0)
>>> t.allowed("10.0.0.9", now=3.0), t.allowed("10.0.0.9", now=33.0)
(False, True)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class _Record:
    failures: list[float] = field(default_factory=list)
    locked_until: float = float("-inf")
    lockouts: int = 0


@dataclass
class LoginThrottle:
    failures: int = 10
    """Failed logins within ``window`` that lock an address out."""
    window: float = 60.0
    penalty: float = 30.0
    """Seconds of the first lock-out; each further one doubles it."""
    max_penalty: float = 900.0
    max_addresses: int = 10_000
    """Addresses remembered (oldest forgotten first): memory stays bounded under a
    flood from many addresses."""
    refused: int = 0
    """Attempts refused without a check (for metrics and logs)."""
    _seen: OrderedDict[str, _Record] = field(default_factory=OrderedDict, repr=False)
    _trusted: OrderedDict[str, None] = field(default_factory=OrderedDict, repr=False)
    """Pairs (address, who) that logged in, most recent last."""

    def allowed(self, address: str, now: float) -> bool:
        """Whether a login from ``address`` may be checked now."""
        record = self._seen.get(address)
        if record is None or now >= record.locked_until:
            return True
        self.refused += 1
        return False

    def failed(self, address: str, now: float) -> None:
        record = self._seen.pop(address, None) or _Record()
        self._seen[address] = record  # most recent last
        record.failures = [t for t in record.failures if t > now - self.window] + [now]
        if len(record.failures) >= self.failures:
            record.locked_until = now + min(self.penalty * 2**record.lockouts, self.max_penalty)
            record.lockouts += 1
            record.failures.clear()
        while len(self._seen) > self.max_addresses:
            self._seen.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._seen.pop(address, None)

    def locked_out(self, address: str, now: float) -> bool:
        record = self._seen.get(address)
        return record is not None and now < record.locked_until

    # -- logins: an address and who ------------------------------------------------
    def may_check(self, address: str, who: str, now: float) -> bool:
        """Whether a login by ``who`` from ``address`` may be checked now."""
        pair = _pair(address, who)
        if pair in self._trusted:
            return self.allowed(pair, now)
        return self.allowed(address, now) and self.allowed(_who(who), now)

    def login_failed(self, address: str, who: str, now: float) -> None:
        for key in (address, _who(who), _pair(address, who)):
            self.failed(key, now)

    def login_succeeded(self, address: str, who: str) -> None:
        pair = _pair(address, who)
        self.succeeded(pair)
        self._trusted.pop(pair, None)
        self._trusted[pair] = None  # most recent last
        while len(self._trusted) > self.max_addresses:
            self._trusted.popitem(last=False)


def _who(who: str) -> str:
    return "who\x00" + who


def _pair(address: str, who: str) -> str:
    return "pair\x00" + address + "\x00" + who
