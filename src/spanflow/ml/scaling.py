"""Scaling River lacks: standardised values squeezed into [0, 1] for Half-Space Trees.

Half-Space Trees split the unit cube at random, so they need features in [0, 1].
River's ``MinMaxScaler`` does that with the extremes seen so far, which an anomaly
then becomes: after one spike the normal values are squeezed into a sliver of the
range and the trees stop telling them apart (on spanflow's labelled series its F1
fell to a fifth of HST's on raw values). :class:`UnitScaler` maps a value's
standard score instead, ``0.5 + z / (2 * width)``, clipped to [0, 1]: ``width``
standard deviations either side fill the cube, and an outlier lands at its edge
without moving the scale for everyone else (the mean and variance are exponentially
weighted, over about ``span`` values, and learn clipped values).
"""

from __future__ import annotations

import math
from typing import Any

from river import base


class UnitScaler(base.Transformer):
    """Standard scores mapped into [0, 1], robust to the outliers it should expose."""

    def __init__(self, width: float = 4.0, span: int = 1000) -> None:
        self.width = width
        self.span = span
        self.n: dict[Any, int] = {}
        self.mean: dict[Any, float] = {}
        self.var: dict[Any, float] = {}

    def learn_one(self, x: dict[Any, Any]) -> None:
        for feature, value in x.items():
            n = self.n.get(feature, 0) + 1
            self.n[feature] = n
            mean, var = self.mean.get(feature, 0.0), self.var.get(feature, 0.0)
            if n > 1 and var > 0:
                limit = self.width * math.sqrt(var)
                value = min(max(value, mean - limit), mean + limit)
            alpha = max(2.0 / (self.span + 1), 1.0 / n)
            delta = value - mean
            self.mean[feature] = mean + alpha * delta
            self.var[feature] = (1 - alpha) * (var + alpha * delta * delta)

    def transform_one(self, x: dict[Any, Any]) -> dict[Any, float]:
        out = {}
        for feature, value in x.items():
            var = self.var.get(feature, 0.0)
            if var <= 0:
                out[feature] = 0.5
                continue
            z = (value - self.mean[feature]) / math.sqrt(var)
            out[feature] = min(1.0, max(0.0, 0.5 + z / (2 * self.width)))
        return out
