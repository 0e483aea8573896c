"""Finding a series' dominant period from the data, streaming, in a small plain state.

A series is summarised as a coarse history: the mean of its values in consecutive
time buckets, at most ``CAPACITY`` of them. The bucket width starts at the median gap
between the first readings; when the history is full, neighbouring buckets are merged
and the width doubles, so the history always spans the whole series seen so far at
the finest resolution that fits (a week of one reading a minute: buckets of 20 min).
Empty buckets (gaps in the data) are kept as ``None``.

Every ``EVERY`` new buckets, and before each merge, the autocorrelation of the
detrended history (a least-squares line removed, values clipped at four median
absolute deviations so that a few spikes do not make a period) is searched for its
first peak that rises at least ``TROUGH`` above the lowest autocorrelation before it
and reaches ``MIN_ACF``. A peak needs two whole periods in the history, so a daily
cycle is found after two to three days. The lag is refined with the peaks at two,
three and four times it (each located to a fraction of a bucket), because one
bucket's error at the first peak is a few percent of the period and would smear a
profile kept over weeks.

    >>> import math
    >>> finder = PeriodFinder()
    >>> state = finder.empty()
    >>> for i in range(6 * 288):                    # six days, one reading per 5 min
    ...     t = i * 300.0
    ...     _ = finder.add(state, 10 + math.sin(2 * math.pi * t / 86400), t)
    >>> round(state["period"] / 3600, 1)
    24.0
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

CAPACITY = 512  # buckets of history: ~5 KB of JSON; merged in pairs when full
EVERY = 32  # look for a period every this many new buckets (and at each merge)
FIRST_GAPS = 9  # readings whose median gap sets the first bucket width
MIN_POINTS = 64  # buckets before the first search
MIN_ACF = 0.3  # a period's autocorrelation at least this ...
TROUGH = 0.2  # ... and this far above the lowest autocorrelation at a shorter lag
CLIP_MADS = 4.0  # values clipped at this many median absolute deviations


class PeriodFinder:
    """Keeps the coarse history of one series and the period found in it."""

    def empty(self) -> dict[str, Any]:
        return {
            "res": None,  # bucket width (seconds, or records without event time)
            "t0": None,  # start of bucket 0
            "cur": None,  # index of the bucket being filled
            "sum": 0.0,
            "cnt": 0,
            "h": [],  # closed buckets' means (None: no reading)
            "first": [],  # (value, time) of the first readings, until the width is set
            "period": None,  # the period found (same unit as time), or None
            "acf": 0.0,  # its autocorrelation: how strong the cycle is
        }

    def add(self, s: dict[str, Any], value: float, t: float) -> bool:
        """Take one reading; True when the period changed."""
        if s["res"] is None:
            first = s["first"]
            first.append([value, t])
            if len(first) <= FIRST_GAPS:
                return False
            gaps = sorted(b[1] - a[1] for a, b in itertools.pairwise(first) if b[1] > a[1])
            s["res"] = gaps[len(gaps) // 2] if gaps else 1.0
            s["t0"] = first[0][1]
            s["first"] = []
            before = s["period"]
            for v, at in first:
                self._bucket(s, v, at)
            return s["period"] != before
        before = s["period"]
        self._bucket(s, value, t)
        return s["period"] != before

    def _bucket(self, s: dict[str, Any], value: float, t: float) -> None:
        # Invariant: h[j] is the bucket (cur - len(h) + j), counted from t0
        index = max(int((t - s["t0"]) // s["res"]), 0)
        if s["cur"] is None:
            s["cur"] = index
        if index > s["cur"]:  # close the bucket; a reading out of order joins the current one
            history = s["h"]
            history.append(s["sum"] / s["cnt"] if s["cnt"] else None)
            missing = index - s["cur"] - 1
            if missing >= CAPACITY:  # a gap longer than the history: nothing before it fits
                s["h"] = history = [None] * (CAPACITY - 1)
            else:
                history.extend([None] * missing)
            s["cur"], s["sum"], s["cnt"] = index, 0.0, 0
            if len(history) >= CAPACITY:
                self._merge(s)
            elif len(history) >= MIN_POINTS and len(history) % EVERY == 0:
                self._search(s)
        s["sum"] += value
        s["cnt"] += 1

    def _merge(self, s: dict[str, Any]) -> None:
        """Search once more at this resolution, then double the bucket width: buckets
        2k and 2k+1 become bucket k."""
        self._search(s)
        history, cur = s["h"], s["cur"]
        first = cur - len(history)
        if first % 2:  # its partner is older than the history
            history = history[1:]
            first += 1
        if cur % 2:  # the last closed bucket shares the new bucket with the open one
            last = history.pop()
            if last is not None:
                s["sum"] += last
                s["cnt"] += 1
        merged: list[float | None] = []
        for a, b in zip(history[::2], history[1::2], strict=False):
            merged.append(a if b is None else b if a is None else (a + b) / 2)
        s["h"], s["cur"], s["res"] = merged, cur // 2, s["res"] * 2

    def _search(self, s: dict[str, Any]) -> None:
        both = _autocorrelation(s["h"])
        if both is None:
            return
        tapered, exact = both
        lag = _first_peak(tapered)
        if lag is None:
            return
        s["period"] = _refined(exact, lag) * s["res"]
        s["acf"] = tapered[lag]

    def profile(self, s: dict[str, Any], buckets: int, anchor: float) -> list[float | None] | None:
        """The found cycle as ``buckets`` offsets from the mean, phases counted from
        ``anchor``, from the last three periods of history (a detector starts from it
        instead of from nothing)."""
        period, res, history = s["period"], s["res"], s["h"]
        if not period or not history:
            return None
        span = int(min(len(history), 3 * period / res))
        recent = history[-span:]
        start = len(history) - span
        known = [x for x in recent if x is not None]
        if not known:
            return None
        mean = sum(known) / len(known)
        sums, counts = [0.0] * buckets, [0] * buckets
        for i, x in enumerate(recent):
            if x is None:
                continue
            t = s["t0"] + (start + i + 0.5) * res
            b = phase_bucket(t, period, buckets, anchor)
            sums[b] += x - mean
            counts[b] += 1
        return [total / n if n else None for total, n in zip(sums, counts, strict=True)]


def phase_bucket(t: float, period: float, buckets: int, anchor: float = 0.0) -> int:
    """The bucket of the cycle that time ``t`` falls in, phases counted from ``anchor``
    (a time near the data: far from it, a period known to a few parts in ten
    thousand says nothing of the phase)."""
    return int(((t - anchor) % period) / period * buckets) % buckets


def _autocorrelation(
    history: list[float | None],
) -> tuple[list[float], list[float]] | None:
    """Autocorrelation up to half the history, of the history with gaps filled by the
    previous value, a least-squares line removed and values clipped (numpy's direct
    correlation: the same numbers on every run). Two estimates: each lag's sum of
    products over the whole variance, which tapers with the lag (cautious: a cycle
    must stand out at a long lag to count), and each lag's mean product, which does
    not (a peak's position, which the taper pulls towards shorter lags)."""
    xs: list[float] = []
    last = None
    for x in history:
        if x is None:
            x = last
        if x is not None:
            xs.append(x)
            last = x
    n = len(xs)
    if n < MIN_POINTS:
        return None
    values = np.asarray(xs, dtype=np.float64)
    index = np.arange(n, dtype=np.float64) - (n - 1) / 2
    centred = values - values.mean()
    slope = float(index @ centred) / float(index @ index)
    d = centred - slope * index
    mad = float(np.sort(np.abs(d))[n // 2])
    if mad <= 0:
        return None
    d = np.clip(d, -CLIP_MADS * mad, CLIP_MADS * mad)
    d -= d.mean()
    var = float(d @ d)
    if var <= 0:
        return None
    sums = np.correlate(d, d, mode="full")[n - 1 : n - 1 + n // 2]
    tapered = sums / var
    exact = tapered * n / (n - np.arange(n // 2))
    return [float(c) for c in tapered], [float(c) for c in exact]


def _first_peak(acf: list[float]) -> int | None:
    """The first local maximum that is high enough and rises far enough."""
    low = 1.0
    for lag in range(2, len(acf) - 1):
        low = min(low, acf[lag])
        peak = acf[lag] > acf[lag - 1] and acf[lag] >= acf[lag + 1]
        if peak and acf[lag] >= MIN_ACF and acf[lag] - low >= TROUGH:
            return lag
    return None


def _refined(acf: list[float], lag: int) -> float:
    """The lag to a fraction of a bucket, from the peaks at its multiples."""
    best = float(lag)
    for multiple in (2, 3, 4):
        centre = round(multiple * best)
        lo, hi = max(2, centre - 2), min(len(acf) - 2, centre + 2)
        if lo >= hi:
            break
        j = max(range(lo, hi + 1), key=acf.__getitem__)
        if acf[j] < MIN_ACF:
            break
        a, b, c = acf[j - 1], acf[j], acf[j + 1]
        curve = a - 2 * b + c
        offset = 0.5 * (a - c) / curve if curve < 0 else 0.0
        best = (j + offset) / multiple
    return best if math.isfinite(best) else float(lag)
