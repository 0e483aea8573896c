"""Sealed node reports: a heartbeat or activity report counts only when its own node sent it.

Every agent logs in to NATS as the shared ``agent`` user, and its reports cross leaf
links where the hub no longer knows which client sent them, so NATS permissions cannot
tell one node's heartbeat from another's. Each report therefore carries a seal: an
HMAC of its subject and body keyed by the sending node's token (in that node's bundle
only; the coordinators derive any node's token from the key they alone hold). A host
holding one agent's bundle can then keep no other node alive, report no activity for
it, and — with :class:`ReportGate`'s order and age checks — cannot replay a captured
report of a node that has died to make it look alive again.

Pure: bytes, strings and times in, a verdict out (the coordinator is the I/O shell).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field

from spanflow.security.secrets import node_token

SEAL_HEADER = "Spanflow-Node-Seal"
"""Where a sealed report carries its seal (NATS message header)."""
MAX_AGE = 300.0
"""Seconds a report's own time may differ from the coordinator's: bounds the replay of
a captured report after a coordinator fails over (its order memory is gone). Clocks of
a deployment are expected to agree within this (NTP)."""


def seal(token: str, subject: str, data: bytes) -> str:
    """The seal of one report: an HMAC-SHA256 of its subject and body under ``token``.

    >>> seal("t", "spanflow.heartbeat.n1", b"{}") == seal("t", "spanflow.heartbeat.n1", b"{}")
    True
    >>> seal("t", "spanflow.heartbeat.n1", b"{}") == seal("t", "spanflow.heartbeat.n2", b"{}")
    False
    """
    mac = hmac.new(token.encode(), subject.encode() + b"\n" + data, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def seal_headers(token: str | None, subject: str, data: bytes) -> dict[str, str] | None:
    """Headers for a report (None when this host has no node token: an open cluster)."""
    return None if token is None else {SEAL_HEADER: seal(token, subject, data)}


@dataclass
class ReportGate:
    """The coordinator's check of a node report. ``agent_key`` None (an open cluster,
    no secrets) lets everything through, as before; otherwise a report counts only
    when it is sealed with its node's token, its time is within :data:`MAX_AGE` of
    ``now``, and (heartbeats) it comes after the last one accepted from that node: the
    same agent with a higher sequence number, or a new agent (a restart) with a later
    time."""

    agent_key: str | None
    max_age: float = MAX_AGE
    log_every: float = 60.0
    """Seconds between warnings about one node's refused reports (a flood logs once)."""
    _last: dict[str, tuple[str, int, float]] = field(default_factory=dict)
    """node → (agent id, sequence, time) of its last accepted heartbeat."""
    _logged: dict[str, float] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.agent_key is None

    def refusal(
        self, node: str, subject: str, data: bytes, sealed: str | None, at: float, now: float
    ) -> str | None:
        """Why a report of ``node`` must not count, or None when it may."""
        if self.agent_key is None:
            return None
        if not sealed:
            return "not sealed (its agent holds no node token: export its bundle again)"
        expected = seal(node_token(self.agent_key, node), subject, data)
        if not hmac.compare_digest(sealed, expected):
            return "its seal is not that node's (sent by another host)"
        if abs(now - at) > self.max_age:
            return f"its time is {now - at:+.0f} s off this coordinator's clock (a replay?)"
        return None

    def heartbeat_refusal(
        self,
        node: str,
        subject: str,
        data: bytes,
        sealed: str | None,
        beat: tuple[str, int, float],
        now: float,
    ) -> str | None:
        """:meth:`refusal`, and for heartbeats their order: ``beat`` is (agent id,
        sequence, time). Accepted beats are remembered."""
        agent, seq, at = beat
        why = self.refusal(node, subject, data, sealed, at, now)
        if why is not None or self.agent_key is None:
            return why
        last = self._last.get(node)
        if last is not None and not _after(beat, last):
            return "older than a heartbeat already heard (a replay)"
        self._last[node] = (agent, seq, at)
        return None

    def worth_logging(self, node: str, now: float) -> bool:
        """Whether to warn about a refused report of ``node`` now: once per
        ``log_every`` seconds and node, for at most 256 names (a flood of made-up
        names logs no more than that)."""
        last = self._logged.get(node)
        if last is not None and now - last < self.log_every:
            return False
        if last is None and len(self._logged) >= 256:
            return False
        self._logged[node] = now
        return True


def _after(beat: tuple[str, int, float], last: tuple[str, int, float]) -> bool:
    """Whether ``beat`` comes after ``last``: the same agent counting on, or another
    agent (the node's agent restarted) that started later.

    >>> _after(("a", 5, 10.0), ("a", 4, 11.0)), _after(("a", 4, 12.0), ("a", 4, 11.0))
    (True, False)
    >>> _after(("b", 1, 12.0), ("a", 9, 11.0)), _after(("b", 1, 10.0), ("a", 9, 11.0))
    (True, False)
    """
    if beat[0] == last[0]:
        return beat[1] > last[1]
    return beat[2] > last[2]
