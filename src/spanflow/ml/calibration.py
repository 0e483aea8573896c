"""Scores that mean the same on every key: a raw score replaced by how rare it is
among the key's recent raw scores.

River's detectors score on scales of their own: Half-Space Trees give most readings
of a real series 0.97 to 0.996, OneClassSVM and LODA are unbounded, and the same number
is common on one key and unheard of on the next. :class:`TailCalibration` keeps a
decaying histogram of a key's raw scores and reports ``log(p) / log(floor)``, where
``p`` is the share of recent scores at least as high: 0.5 means one in 100 with the
default ``floor`` of 1e-4, 1 means rarer than one in 10,000. A threshold then means
the same false-alarm rate on every key, as the ``likelihood`` detector's does.

The histogram (:class:`DecayingHistogram`, shared with the quantile threshold) has
400 bins over ``-log(1 - score)`` (0 to 14), fine where scores crowd near 1 as well
as near 0; its counts decay by ``decay`` per score (a half-life of about 7,000
scores), so the calibration follows a changing stream. State: the bins as a list.

    >>> c = TailCalibration()
    >>> state = c.empty()
    >>> [round(c.step(state, s), 2) for s in (0.1, 0.1, 0.1, 0.9)]
    [0.0, 0.0, 0.0, 0.15]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DecayingHistogram:
    """Counts of scores in [0, 1], newest weighing most, as plain data."""

    decay: float = 1e-4
    bins: int = 400
    top: float = 14.0  # -log(1 - score) of the last bin's upper edge (score 1 - 8e-7)

    def empty(self) -> dict[str, Any]:
        # Decay without touching every bin: new scores weigh more and more instead
        return {"h": [0.0] * self.bins, "n": 0.0, "w": 1.0}

    def bin(self, score: float) -> int:
        position = -math.log(max(1.0 - score, 1e-12)) / self.top * self.bins
        return min(max(int(position), 0), self.bins - 1)

    def add(self, state: dict[str, Any], score: float) -> None:
        hist, weight = state["h"], state["w"]
        hist[self.bin(score)] += weight
        state["n"] += weight
        weight /= 1.0 - self.decay
        if weight > 1e12:  # rescale before the numbers grow too large
            state["h"] = [c / weight for c in hist]
            state["n"] /= weight
            weight = 1.0
        state["w"] = weight


@dataclass(frozen=True)
class TailCalibration:
    """A raw score in [0, 1] as ``log(share of recent scores at least as high) /
    log(floor)``, clipped to [0, 1]; decides before it learns the score."""

    floor: float = 1e-4
    histogram: DecayingHistogram = field(default_factory=DecayingHistogram)

    def empty(self) -> dict[str, Any]:
        return self.histogram.empty()

    def step(self, state: dict[str, Any], raw: float) -> float:
        raw = min(max(raw, 0.0), 1.0) if math.isfinite(raw) else 0.0
        hist, total, weight = state["h"], state["n"], state["w"]
        at_least = sum(hist[self.histogram.bin(raw) :])
        # The score itself counts as seen, so a key's first score is not "rare"
        share = (at_least + weight) / (total + weight)
        self.histogram.add(state, raw)
        return max(0.0, min(1.0, math.log(share) / math.log(self.floor)))
