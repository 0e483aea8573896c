"""The control plane without NATS: an in-memory log for testing decision rooms.

:class:`InMemoryControl` commits a draft's records the way the coordinator's shell
does — appended to a list (the log), applied to the state by the same ``apply`` — with
a :class:`~spanflow.clock.FakeClock`, so a test can drive heartbeats, silences and
moves in milliseconds and replay the log into a fresh state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from spanflow.clock import FakeClock
from spanflow.control import records as r
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed, apply

T = TypeVar("T")


class InMemoryControl:
    def __init__(self, settings: CoordinatorSettings | None = None) -> None:
        self.settings = settings or CoordinatorSettings(nats_url="nats://unused:4222")
        self.clock = FakeClock()
        self.state = ClusterState()
        self.observed = Observed()
        self.log: list[r.Record] = []

    def decide(self, decide: Callable[[Draft], T]) -> T:
        """Run a decision and commit its records (none when it raises)."""
        tx = Draft(self.state, self.clock.time(), epoch=self.state.leader_epoch)
        result = decide(tx)
        for record in tx.records:
            self.log.append(record)
            apply(self.state, record)
            self.state.applied = len(self.log)
        self.observed.prune(self.state)
        return result

    def replayed(self) -> ClusterState:
        """A fresh state folded from the log (through JSON, as a standby reads it)."""
        state = ClusterState()
        for seq, record in enumerate(self.log, start=1):
            apply(state, r.decode(r.encode(record)))
            state.applied = seq
        return state

    def kinds(self) -> list[str]:
        return [record.kind for record in self.log]
