"""Labelled sensor series with injected anomalies, for the quality benchmark, the
tests and the demo's simulator.

A series is one reading a minute of two fields: ``temperature`` with a daily cycle
and ``vibration`` without, both with Gaussian noise. After a first normal day (the
detectors' warm-up), anomalies of one kind are injected into one field:

* ``spike``: one to three readings 6 to 10 standard deviations off;
* ``level_shift``: one to four hours shifted by 4 to 6 standard deviations;
* ``drift``: five to ten hours drifting linearly away, up to 6 to 8 standard
  deviations, then back to normal;
* ``stuck``: one to three hours of the same value repeated;
* ``broken_season``: three to six hours around a daily peak or trough where the
  daily cycle does not happen (values normal for the day, not for the hour).

Every reading of an injected segment is labelled anomalous.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

KINDS = ("spike", "level_shift", "drift", "stuck", "broken_season")
DAY = 1440  # readings a day
START = datetime(2026, 1, 5, tzinfo=UTC)


@dataclass(frozen=True)
class Series:
    kind: str
    times: list[datetime]
    values: list[dict[str, float]]
    labels: list[bool]
    segments: list[tuple[int, int]]
    """Injected anomalies as [start, end) reading indices."""


def labelled_series(kind: str, seed: int, *, days: int = 4, segments: int = 4) -> Series:
    """A series of ``days`` days with ``segments`` anomalies of ``kind`` after day one."""
    if kind not in KINDS:
        raise ValueError(f"unknown anomaly kind {kind!r}; kinds: {', '.join(KINDS)}")
    rng = random.Random(f"{kind}-{seed}")
    n = days * DAY
    sigma_t, sigma_v, amplitude = 0.5, 0.05, 3.0
    base_t, base_v = rng.uniform(18, 28), rng.uniform(0.4, 0.8)
    cycle = [amplitude * math.sin(2 * math.pi * (i % DAY) / DAY) for i in range(n)]
    noise_t = [rng.gauss(0, sigma_t) for _ in range(n)]
    noise_v = [rng.gauss(0, sigma_v) for _ in range(n)]
    temperature = [base_t + cycle[i] + noise_t[i] for i in range(n)]
    vibration = [base_v + noise_v[i] for i in range(n)]
    labels = [False] * n
    placed: list[tuple[int, int]] = []
    slot = (n - DAY) // segments
    for s in range(segments):
        field = "temperature" if kind == "broken_season" or rng.random() < 0.5 else "vibration"
        series, sigma = (temperature, sigma_t) if field == "temperature" else (vibration, sigma_v)
        lo = DAY + s * slot
        start, end = _inject(kind, rng, series, sigma, cycle, lo, lo + slot)
        placed.append((start, end))
        for i in range(start, end):
            labels[i] = True
    times = [START + timedelta(minutes=i) for i in range(n)]
    values = [{"temperature": temperature[i], "vibration": vibration[i]} for i in range(n)]
    return Series(kind, times, values, labels, placed)


def _inject(
    kind: str,
    rng: random.Random,
    series: list[float],
    sigma: float,
    cycle: list[float],
    lo: int,
    hi: int,
) -> tuple[int, int]:
    """Inject one anomaly within [lo, hi) (leaving room after it); its [start, end)."""
    sign = rng.choice((-1, 1))
    if kind == "spike":
        start = rng.randrange(lo + 60, hi - 60)
        end = start + rng.randint(1, 3)
        for i in range(start, end):
            series[i] += sign * rng.uniform(6, 10) * sigma
    elif kind == "level_shift":
        length = rng.randint(60, 240)
        start = rng.randrange(lo + 60, hi - length - 60)
        end, shift = start + length, sign * rng.uniform(4, 6) * sigma
        for i in range(start, end):
            series[i] += shift
    elif kind == "drift":
        length = rng.randint(300, 600)
        start = rng.randrange(lo + 60, hi - length - 60)
        end, top = start + length, sign * rng.uniform(6, 8) * sigma
        for i in range(start, end):
            series[i] += top * (i - start + 1) / length
    elif kind == "stuck":
        length = rng.randint(60, 180)
        start = rng.randrange(lo + 60, hi - length - 60)
        end = start + length
        for i in range(start, end):
            series[i] = series[start - 1]
    else:  # broken_season: around a peak (minute 360 of the day) or trough (1080)
        length = rng.randint(180, 360)
        days = [d for d in range(lo // DAY, hi // DAY + 1)]
        centres = [
            d * DAY + c
            for d in days
            for c in (360, 1080)
            if lo + 60 <= d * DAY + c - length // 2 and d * DAY + c + length // 2 < hi - 60
        ]
        centre = rng.choice(centres)
        start, end = centre - length // 2, centre - length // 2 + length
        for i in range(start, end):
            series[i] -= cycle[i]
    return start, end


@dataclass(frozen=True)
class Quality:
    """Composite F-score (Garg et al., 2021): recall counts anomalies (segments) with at
    least one flagged reading, precision counts flagged readings that fall in one; the
    delay is readings from a segment's start to its first flag (detected segments)."""

    precision: float
    recall: float
    f1: float
    delays: list[int]


def quality(series: Series, flags: list[bool]) -> Quality:
    """How well ``flags`` (one per reading, warm-up included) find ``series``' anomalies."""
    flagged = sum(flags)
    true_flags = sum(1 for f, label in zip(flags, series.labels, strict=True) if f and label)
    delays = []
    for start, end in series.segments:
        first = next((i for i in range(start, end) if flags[i]), None)
        if first is not None:
            delays.append(first - start)
    recall = len(delays) / len(series.segments)
    precision = true_flags / flagged if flagged else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return Quality(precision, recall, f1, delays)
