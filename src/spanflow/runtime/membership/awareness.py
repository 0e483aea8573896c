"""Lifeguard's local health: how much this member should distrust itself.

A member that misses acks and gets no nacks from its indirect helpers, or that has to
refute a suspicion of itself, is probably the slow one (a CPU-starved agent, a full
socket buffer). Its score rises (bounded by ``maximum - 1``) and it stretches its
probe interval by ``score + 1``, so it accuses others more slowly until it recovers;
every successful probe lowers the score again.
"""

from __future__ import annotations


class Awareness:
    def __init__(self, maximum: int) -> None:
        self.maximum = max(1, maximum)
        self.score = 0

    def apply(self, delta: int) -> None:
        self.score = min(self.maximum - 1, max(0, self.score + delta))

    def scale(self, timeout: float) -> float:
        return timeout * (self.score + 1)
