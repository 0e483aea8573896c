"""The ``mewma`` method, the textbook chart (``multivariate`` until 2026-12): how a
key's fields move *together*, with faults kept as states.

A pump's fault shows in how current, pressure, flow and vibration move together, each
of them perhaps still inside its own usual range; a detector that watches each field
alone misses it. This one is the multivariate exponentially weighted moving average
(MEWMA) control chart of Lowry, Woodall, Champ and Rigdon (*A multivariate
exponentially weighted moving average control chart*, Technometrics 34(1), 1992):

* **Baseline.** The first ``warmup`` readings of a key give the mean vector ``mu`` and
  the covariance ``S`` of its fields (shrunk toward the diagonal by ``shrinkage``, so
  a field that barely moves, or two that always move together, do not make ``S``
  singular).
* **Statistic.** ``z = smoothing * (x - mu) + (1 - smoothing) * z`` and
  ``T2 = z' (S * smoothing / (2 - smoothing))^-1 z``: Hotelling's T-squared of the
  smoothed deviation, which averages noise away and keeps a shift that lasts.
* **Limit.** ``margin`` times the 99th percentile of the statistic over the second half
  of the warm-up (the chart's in-control run on the baseline's own readings, which
  understates new readings' spread: hence the margin) — and never below ``margin``
  times the statistic's 99.9th percentile in theory (chi-squared with one degree of
  freedom per field), so a short warm-up cannot set a limit that noise crosses.
* **Faults are states.** A key whose statistic crosses the limit is *anomalous* until it
  comes back: its statistic falls below ``release`` times the level it held during the
  fault (and below the limit or not) for ``settle`` readings in a row — the fault was
  undone, even if the machine does not return exactly where it started. Then the mean
  is re-centred on those ``settle`` readings. While a key is anomalous nothing is
  learnt, so a fault never becomes the new normal by itself; after ``accept_after``
  readings in one episode (default: never) its readings are taken as the new normal.
  While normal the mean follows slow drift (half-life ``adapt`` readings).

The score is ``T2 / (T2 + limit)`` — 0.5 at the limit — and at least 0.5 while the key
is anomalous, so the default static threshold of 0.5 flags exactly the anomalous
state. The field named is the one contributing most to ``T2`` (``z_i * (S^-1 z)_i``,
the usual contribution decomposition).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from spanflow.ml.detector import Detector, finite_vector

DEFAULTS: dict[str, Any] = {
    "smoothing": 0.1,
    "margin": 2.0,
    "release": 0.5,
    "settle": 30,
    "adapt": 4000,
    "accept_after": None,
    "shrinkage": 0.1,
}
"""Documented in docs/ml.md, with the figures they were chosen by."""
LIMIT_QUANTILE = 0.99
THEORY_Z = 3.090
"""The standard normal's 99.9th percentile (:func:`chi_squared_quantile`)."""


def chi_squared_quantile(dof: int, z: float = THEORY_Z) -> float:
    """Wilson and Hilferty's approximation (1931) of a chi-squared quantile: within 1 %
    from a few degrees of freedom on, and no statistics library needed.

    >>> round(chi_squared_quantile(8), 1)  # the exact quantile: 26.12
    26.3
    """
    k = 2 / (9 * dof)
    return float(dof * (1 - k + z * math.sqrt(k)) ** 3)


LEVEL_WEIGHT = 0.02
"""How fast an episode's level (a geometric mean of its statistics: a spike barely
moves it) follows them: a half-life of about 35 readings."""


@dataclass
class Live:
    """A key's working state (plain data out of :meth:`MewmaDetector.save`)."""

    learning: list[list[float]] = field(default_factory=list)
    mu: np.ndarray | None = None
    inverse: np.ndarray | None = None
    limit: float = 0.0
    z: np.ndarray | None = None
    anomalous: bool = False
    level: float = 0.0
    """log of the episode's typical statistic."""
    calm: int = 0
    recent: list[list[float]] = field(default_factory=list)
    episode: int = 0


class MewmaDetector(Detector):
    """MEWMA T-squared over ``fields`` (see the module's description)."""

    def __init__(self, fields: tuple[str, ...], *, warmup: int = 200, **params: Any) -> None:
        unknown = set(params) - set(DEFAULTS)
        if unknown:
            raise ValueError(
                f"unknown parameter(s) {sorted(unknown)} for method mewma; "
                f"parameters: {', '.join(DEFAULTS)}"
            )
        p = {**DEFAULTS, **params}
        self.fields = fields
        self.warmup = max(int(warmup), 2 * len(fields) + 2)
        self.smoothing = float(p["smoothing"])
        self.margin = float(p["margin"])
        self.release = float(p["release"])
        self.settle = int(p["settle"])
        self.adapt = float(p["adapt"] or 0)
        self.accept_after = None if p["accept_after"] is None else int(p["accept_after"])
        self.shrinkage = float(p["shrinkage"])
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing is in (0, 1], not {self.smoothing}")
        if not 0 <= self.shrinkage <= 1:
            raise ValueError(f"shrinkage is in [0, 1], not {self.shrinkage}")
        if self.margin <= 0 or self.settle < 1 or not 0 < self.release <= 1:
            raise ValueError("margin > 0, settle >= 1 and release in (0, 1] are required")
        self._drift = 1 - 0.5 ** (1 / self.adapt) if self.adapt > 0 else 0.0

    # -- state ---------------------------------------------------------------------------
    def load(self, state: Any) -> Live:
        if state is None:
            return Live()
        live = Live(
            learning=state.get("learn", []),
            limit=state.get("limit", 0.0),
            anomalous=state.get("on", False),
            level=state.get("level", 0.0),
            calm=state.get("calm", 0),
            recent=state.get("recent", []),
            episode=state.get("episode", 0),
        )
        if state.get("mu") is not None:
            live.mu = np.asarray(state["mu"], dtype=float)
            live.inverse = np.asarray(state["inv"], dtype=float)
            live.z = np.asarray(state["z"], dtype=float)
        return live

    def save(self, live: Live) -> Any:
        out: dict[str, Any] = {"learn": live.learning} if live.mu is None else {}
        if live.mu is not None:
            assert live.inverse is not None and live.z is not None
            out.update(
                mu=live.mu.tolist(),
                inv=live.inverse.tolist(),
                z=live.z.tolist(),
                limit=live.limit,
                on=live.anomalous,
                level=live.level,
                calm=live.calm,
                recent=live.recent,
                episode=live.episode,
            )
        return out

    # -- scoring -------------------------------------------------------------------------
    def step(
        self, live: Live, record: Mapping[str, Any], at: datetime | None
    ) -> tuple[float, str | None]:
        x = finite_vector(record, self.fields)
        if x is None:  # a missing or non-finite field: no score, nothing learnt
            return 0.0, None
        if live.mu is None:
            live.learning.append(x.tolist())
            if len(live.learning) >= self.warmup:
                self._fit(live)
            return 0.0, None
        assert live.inverse is not None and live.z is not None
        d = x - live.mu
        z = live.z
        z *= 1 - self.smoothing
        z += self.smoothing * d
        pulled = live.inverse @ z
        t2 = float(z @ pulled)
        self._track(live, x, d, t2)
        score = t2 / (t2 + live.limit) if live.limit > 0 else 0.0
        if live.anomalous:
            score = max(score, 0.5)
        top = int(np.argmax(z * pulled))
        return score, self.fields[top]

    def _fit(self, live: Live) -> None:
        """The baseline from the warm-up's readings, and the limit from the chart's run
        over them."""
        rows = np.asarray(live.learning, dtype=float)
        live.mu = rows.mean(axis=0)
        cov = np.atleast_2d(np.cov(rows, rowvar=False))
        diagonal = np.diag(np.diag(cov))
        cov = (1 - self.shrinkage) * cov + self.shrinkage * diagonal
        # a field that never moved gets a small variance of its own, not a zero
        floor = max(float(np.max(np.diag(cov))), 1.0) * 1e-9
        cov = cov + floor * np.eye(len(self.fields))
        scale = self.smoothing / (2 - self.smoothing)
        live.inverse = np.linalg.pinv(cov * scale)
        z = np.zeros(len(self.fields))
        stats = []
        for row in rows:
            z = self.smoothing * (row - live.mu) + (1 - self.smoothing) * z
            stats.append(float(z @ live.inverse @ z))
        tail = stats[len(stats) // 2 :]
        seen = float(np.quantile(tail, LIMIT_QUANTILE))
        live.limit = self.margin * max(seen, chi_squared_quantile(len(self.fields)))
        live.z = z
        live.learning = []

    def _track(self, live: Live, x: np.ndarray, d: np.ndarray, t2: float) -> None:
        """The key's state: open an episode, hold it, release it when the fault is
        undone; follow slow drift while normal."""
        if not live.anomalous:
            if t2 > live.limit:
                live.anomalous, live.level, live.calm, live.episode = True, math.log(t2), 0, 1
                live.recent = []
            elif self._drift:
                assert live.mu is not None
                live.mu += self._drift * d
            return
        live.episode += 1
        live.recent.append(x.tolist())
        if len(live.recent) > self.settle:
            del live.recent[0]
        if t2 < self.release * math.exp(live.level) or t2 < live.limit:
            live.calm += 1
        else:
            live.calm = 0
            live.level += LEVEL_WEIGHT * (math.log(t2) - live.level)
        accepted = self.accept_after is not None and live.episode >= self.accept_after
        if live.calm >= self.settle or accepted:
            self._rebaseline(live)

    def _rebaseline(self, live: Live) -> None:
        """The readings since the fault was undone (or, accepted, the latest ones) are
        the new normal: the mean moves there, the covariance stays."""
        live.anomalous, live.level, live.calm, live.episode = False, 0.0, 0, 0
        if live.recent:
            live.mu = np.asarray(live.recent, dtype=float).mean(axis=0)
        live.recent = []
        live.z = np.zeros(len(self.fields))
