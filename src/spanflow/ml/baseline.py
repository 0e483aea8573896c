"""The robust streaming baseline: spanflow's default anomaly detector.

One small model per field, updated with every record, whose state is a dict of plain
numbers (so it is cheap keyed state). For each value it predicts

    expected = level + season(time of day)

and scores how far the value is from it in robust standard deviations:

* **level** is an exponentially weighted mean whose updates are clipped (a Huber
  step): a spike barely moves it, a lasting change of level is followed within
  about ``span`` records, a slow drift is followed closely;
* **scale** is the exponentially weighted mean absolute residual (times 1.2533, the
  normal distribution's ratio of standard deviation to mean absolute deviation),
  also clipped, so the noise estimate is not blown up by the anomalies it should find;
* **season** (with event time) is a daily profile of 24 hourly offsets, linearly
  interpolated between hours and learnt from the clipped residuals: a value normal
  at noon but not at midnight — a broken daily pattern — stands out;
* **drift**: a second level follows ``drift_span`` times more slowly; when the fast
  level moves away from it by more than the noise allows, the field is drifting;
* **stuck**: a sensor that repeats exactly the same value ``stuck_after`` times,
  when its values rarely repeated before, is stuck; its score grows with the run.

A field's deviation is the largest of the three (residual, drift, stuck) in units of
its scale; the record's score is ``z² / (z² + 16)`` of its most deviant field: 0.5 at
four robust standard deviations, 0.8 at eight. Everything is deterministic: the
same records in the same order give the same scores, restart or not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

SIGMA_PER_MAD = 1.2533
BUCKETS = 24


def score_of(z: float) -> float:
    """A deviation in robust standard deviations as a score in [0, 1)."""
    z2 = z * z
    return z2 / (z2 + 16.0)


class RobustBaseline:
    """Per-field robust level, scale, daily season, drift and stuck-value checks."""

    def __init__(
        self,
        fields: tuple[str, ...],
        *,
        span: int = 200,
        drift_span: int = 10,
        clip: float = 3.0,
        season_rate: float = 0.3,
        seasonality: float | None = None,
        stuck_after: int = 10,
        cusum_slack: float = 0.5,
        cusum_limit: float = 20.0,
    ) -> None:
        self.fields = fields
        self.alpha = 2.0 / (span + 1)
        self.slow = 2.0 / (span * drift_span + 1)
        self.clip = clip
        self.season_rate = season_rate
        self.period = seasonality
        self.stuck_after = stuck_after
        self.cusum_slack = cusum_slack
        self.cusum_limit = cusum_limit

    def empty(self) -> dict[str, Any]:
        return {f: None for f in self.fields}

    def _phase(self, at: datetime | None) -> tuple[float, int, int, float] | None:
        """(time in seconds, bucket, next bucket, weight of next) within the season."""
        if self.period is None or at is None:
            return None
        t = at.timestamp()
        position = (t % self.period) / self.period * BUCKETS - 0.5
        low = math.floor(position)
        return t, low % BUCKETS, (low + 1) % BUCKETS, position - low

    def step(
        self, state: dict[str, Any], record: Mapping[str, Any], at: datetime | None
    ) -> tuple[float, str | None]:
        """Score one record against the baseline, then learn from it. Returns the
        largest deviation (robust standard deviations) and the field it was in."""
        phase = self._phase(at)
        best, best_field = 0.0, None
        for field in self.fields:
            value = record.get(field)
            if value is None or not math.isfinite(value):
                continue
            s = state.get(field)
            if s is None:
                state[field] = _new_field(float(value), phase)
                continue
            z = self._field_step(s, float(value), phase)
            if z > best:
                best, best_field = z, field
        return best, best_field

    def _field_step(
        self, s: dict[str, Any], x: float, phase: tuple[float, int, int, float] | None
    ) -> float:
        n = s["n"] = s["n"] + 1
        season = s["season"]
        offset = 0.0
        if phase is not None and season is not None:
            _, lo, hi, w = phase
            offset = season[lo] * (1 - w) + season[hi] * w
        residual = x - s["level"] - offset
        sigma = s["mad"] * SIGMA_PER_MAD
        z = abs(residual) / sigma if sigma > 0 else 0.0
        drift = self._drift(s, x - s["ref"] - offset, sigma)
        stuck = self._stuck(s, x, sigma)
        # Learn: plain running means at first, then clipped exponential updates
        alpha = max(self.alpha, 1.0 / n)
        limit = self.clip * sigma if n > 10 and sigma > 0 else math.inf
        clipped = min(max(residual, -limit), limit)
        s["level"] += alpha * clipped
        away = min(max(x - offset - s["ref"], -limit), limit)
        s["ref"] += max(self.slow, 1.0 / n) * away
        s["mad"] += alpha * (min(abs(residual), limit) - s["mad"])
        if phase is not None and season is not None:
            self._learn_season(s, season, phase, away, offset)
        return max(z, drift, stuck)

    def _drift(self, s: dict[str, Any], deviation: float, sigma: float) -> float:
        """Two-sided CUSUM of the value against the slow level: a drift too slow for
        the residual to show adds up here."""
        if sigma <= 0:
            return 0.0
        # Steps are clipped (a spike is not a drift) and the sums capped a little
        # above the limit (so that the alarm ends soon after the drift does)
        d = min(max(deviation / sigma, -self.clip), self.clip)
        cap = 1.25 * self.cusum_limit
        s["up"] = min(cap, max(0.0, s["up"] + d - self.cusum_slack))
        s["down"] = min(cap, max(0.0, s["down"] - d - self.cusum_slack))
        return 4.0 * max(s["up"], s["down"]) / self.cusum_limit

    def _stuck(self, s: dict[str, Any], x: float, sigma: float) -> float:
        """Grows with a run of identical values, for a field whose values rarely
        repeated before the run began."""
        repeat = x == s["last"]
        s["run"] = s["run"] + 1 if repeat else 0
        if not repeat:
            s["rep_before"] = s["rep"]
        s["rep"] += 0.01 * ((1.0 if repeat else 0.0) - s["rep"])
        s["last"] = x
        if s["run"] + 1 >= self.stuck_after and s["rep_before"] < 0.2 and sigma > 0:
            return 4.0 * (s["run"] + 1) / self.stuck_after
        return 0.0

    def _learn_season(
        self,
        s: dict[str, Any],
        season: list[float],
        phase: tuple[float, int, int, float],
        away: float,
        offset: float,
    ) -> None:
        """Move the profile towards the value's distance from the slow level, at a
        rate per *period* (a share of each day, whatever the sampling interval): all
        of it in the first period, then a running mean down to ``season_rate``. So a
        few broken hours shift the profile a little, not to themselves."""
        t, lo, hi, w = phase
        gap = t - s["t"]
        s["t"] = t
        if gap > 0:
            s["dt"] = gap if s["dt"] <= 0 else s["dt"] + 0.05 * (gap - s["dt"])
        if s["dt"] <= 0 or self.period is None:
            return
        per_bucket = max(1.0, self.period / BUCKETS / s["dt"])
        # A running mean per hour while it has little data, then a share per period
        most = per_bucket / self.season_rate
        weights = s["sw"]
        bucket = lo if w < 0.5 else hi  # the hour the value belongs to
        weights[bucket] = min(most, weights[bucket] + 1.0)
        season[bucket] += (away + offset - season[bucket]) / weights[bucket]


def _new_field(x: float, phase: tuple[float, int, int, float] | None) -> dict[str, Any]:
    t = phase[0] if phase is not None else 0.0
    return {
        "t0": t,
        "t": t,
        "dt": 0.0,
        "n": 1,
        "level": x,
        "ref": x,
        "mad": 0.0,
        "season": [0.0] * BUCKETS if phase is not None else None,
        "sw": [0.0] * BUCKETS if phase is not None else None,
        "last": x,
        "run": 0,
        "rep": 0.0,
        "rep_before": 0.0,
        "up": 0.0,
        "down": 0.0,
    }
