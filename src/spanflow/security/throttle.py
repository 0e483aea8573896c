"""Login throttling per source address: pure, with the time passed in.

A door that checks passwords or tokens (the MQTT gateway, the REST API, HTTP ingest)
asks :meth:`LoginThrottle.allowed` before it checks, and reports the outcome. An
address that failed ``failures`` times within ``window`` seconds is refused without a
check for ``penalty`` seconds, doubled at each further lock-out up to ``max_penalty``:
a guesser gets a handful of tries a minute, a device with a stale password keeps
logging a clear refusal, and a good login clears the address's record.

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
