"""When a score is an anomaly: a fixed threshold, a quantile of the scores seen, or an
adaptive one (mean + k standard deviations of recent scores).

Each threshold keeps its state as plain data and decides *before* it learns the new
score, so an anomaly does not raise the bar it is measured against.

    >>> t = make_threshold("quantile(0.9)")
    >>> state = t.empty()
    >>> [t.step(state, s / 100) for s in range(100)][-1]
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from spanflow.ml.calibration import DecayingHistogram
from spanflow.spec.steps.models import parse_threshold


class Threshold:
    """Decides whether a score in [0, 1] is anomalous, learning from every score."""

    def empty(self) -> dict[str, Any]:
        return {}

    def step(self, state: dict[str, Any], score: float) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Static(Threshold):
    """Anomalous at or above a fixed score."""

    at: float

    def step(self, state: dict[str, Any], score: float) -> bool:
        return score >= self.at


@dataclass(frozen=True)
class Quantile(Threshold):
    """Anomalous above the ``q`` quantile of the key's scores so far.

    The scores are counted in a :class:`~spanflow.ml.calibration.DecayingHistogram`
    (400 bins over ``-log(1 - score)``, fine where scores crowd near 1 as well as
    near 0) whose counts forget with a half-life of about 7,000 scores, so the bar
    follows a changing stream."""

    q: float
    histogram: DecayingHistogram = field(default_factory=DecayingHistogram)

    def empty(self) -> dict[str, Any]:
        return self.histogram.empty()

    def step(self, state: dict[str, Any], score: float) -> bool:
        total = state["n"]
        anomalous = total > 0 and self.histogram.bin(score) > self._bar_bin(state["h"], total)
        self.histogram.add(state, score)
        return anomalous

    def _bar_bin(self, hist: list[float], total: float) -> int:
        """The bin holding the ``q`` quantile: a score in a higher bin is above it."""
        running = 0.0
        for i, count in enumerate(hist):
            running += count
            if running >= self.q * total:
                return i
        return len(hist) - 1


@dataclass(frozen=True)
class Adaptive(Threshold):
    """Anomalous above the exponentially weighted mean + ``k`` standard deviations of
    recent scores (about the last ``span`` scores), and above ``floor``."""

    k: float = 3.0
    span: int = 500
    floor: float = 0.2

    def empty(self) -> dict[str, Any]:
        return {"mean": 0.0, "var": 0.0, "n": 0}

    def step(self, state: dict[str, Any], score: float) -> bool:
        mean, var, n = state["mean"], state["var"], state["n"]
        anomalous = n > 0 and score >= self.floor and score > mean + self.k * math.sqrt(var)
        alpha = max(2.0 / (self.span + 1), 1.0 / (n + 1))
        delta = score - mean
        state["mean"] = mean + alpha * delta
        state["var"] = (1 - alpha) * (var + alpha * delta * delta)
        state["n"] = n + 1
        return anomalous


def make_threshold(value: float | str) -> Threshold:
    """The threshold a step's ``threshold`` field names (see
    :func:`spanflow.spec.steps.models.parse_threshold`)."""
    kind, number = parse_threshold(value)
    if kind == "static":
        return Static(number)
    if kind == "quantile":
        return Quantile(number)
    return Adaptive(k=number)
