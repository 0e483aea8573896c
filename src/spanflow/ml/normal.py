"""A machine's normal, learned from its readings: what the ``multivariate`` method fits on
a key's warm-up (or ``spanflow detector fit`` on its history) and then scores against.

Sensors of one machine behave in two ways. Some hover around a set point with noise
(current, flow, pressure, vibration): their normal is a level. Others wander slowly and
smoothly (temperatures, levels in a tank): a warm-up of minutes cannot say where they
will be in an hour, only how they move from one reading to the next. A chart that
measures the slow ones against the warm-up's level alarms on every drift; one that
lets every field follow its recent past forgets a fault that lasts.

So each field gets the one-step forecast that fits its warm-up best — the textbook
answer for autocorrelated data (Montgomery, *Introduction to Statistical Quality
Control*, ch. 10: chart the residuals of a time-series model, not the readings):

* a **level** (the warm-up's mean) for a field no other forecast beats by ``gain``
  (its one-step squared error must fall below ``gain`` times the level's);
* an **AR(1) around the level**, ``mu + phi * (previous - mu)``, for a field that
  lingers but comes back (a vibration's RMS): its level stays what the warm-up says, so
  a shift that lasts keeps showing in the innovations (``(1 - phi)`` of it);
* an **exponential smoother** ``f <- f + lam * (x - f)`` (the ``lam`` of ``LAMBDAS``
  that forecasts the warm-up best) for a field that wanders without coming back (a
  temperature, ``phi`` near 1): judged by its surprises, not by how far it wandered.

Of the AR(1) (when ``phi`` < ``UNIT``) and the smoother, the one with the smaller
one-step error is taken, when it beats the level by ``gain``.

The fit keeps each field's forecast kind, the level or smoother state, the standard
deviation of its one-step errors (its *innovations*), and how much an exponentially
weighted mean of those standardized innovations really spreads on the warm-up, beside
what white noise would give (the *inflation*: innovations of a real sensor are rarely
white). It is plain data (:class:`Normal`), so it can be pushed to the model registry,
checked and restored like any model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LAMBDAS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
"""Smoothing constants a field's forecast may take (1: the previous reading)."""
UNIT = 0.9
"""A lag-one autocorrelation this high is a field that wanders (a smoother's), not one
that comes back (an AR(1)'s)."""
FORMAT = 1
"""Version of :meth:`Normal.plain`'s layout."""


@dataclass
class Normal:
    """A fitted normal: per field, its forecast's ``lam`` (a smoother's; 0: none) and
    ``phi`` (an AR(1)'s; 0: none), its level (or the smoother's state), the innovations'
    standard deviation and the chart's scale."""

    fields: tuple[str, ...]
    lam: np.ndarray
    phi: np.ndarray
    level: np.ndarray
    sd: np.ndarray
    scale: np.ndarray
    """Standard deviation of the smoothed standardized innovations, per field."""
    smoothing: float
    rows: int
    """Readings it was fitted on."""

    @property
    def moving(self) -> np.ndarray:
        return self.lam > 0

    def plain(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "fields": list(self.fields),
            "lam": self.lam.tolist(),
            "phi": self.phi.tolist(),
            "level": self.level.tolist(),
            "sd": self.sd.tolist(),
            "scale": self.scale.tolist(),
            "smoothing": self.smoothing,
            "rows": self.rows,
        }

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> Normal:
        """A fitted normal from :meth:`plain` (ValueError when it is not one)."""
        try:
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
            fields = tuple(str(f) for f in data["fields"])
            names = ("lam", "phi", "level", "sd", "scale")
            arrays = [np.asarray(data[k], dtype=float) for k in names]
            smoothing, rows = float(data["smoothing"]), int(data["rows"])
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a fitted normal: {exc}") from None
        if any(a.shape != (len(fields),) or not np.all(np.isfinite(a)) for a in arrays):
            raise ValueError("not a fitted normal: one finite number per field expected")
        lam, phi, level, sd, scale = arrays
        if np.any(lam < 0) or np.any(lam > 1) or np.any(phi < 0) or np.any(phi >= 1):
            raise ValueError("not a fitted normal: lam in [0, 1], phi in [0, 1)")
        if np.any((lam > 0) & (phi > 0)) or np.any(sd <= 0) or np.any(scale <= 0):
            raise ValueError("not a fitted normal: one forecast per field, sd and scale > 0")
        if not 0 < smoothing <= 1:
            raise ValueError("not a fitted normal: smoothing in (0, 1]")
        return cls(fields, lam, phi, level, sd, scale, smoothing, rows)


def choose_forecasts(rows: np.ndarray, gain: float, burn: int) -> tuple[np.ndarray, np.ndarray]:
    """Each field's (``lam``, ``phi``): (0, 0), a fixed level, unless the better of an
    AR(1) (when the field comes back: ``phi`` < ``UNIT``) and a smoother makes a one-step
    squared error on ``rows`` (after ``burn`` readings) below ``gain`` times the level's."""
    lam, phi = np.zeros(rows.shape[1]), np.zeros(rows.shape[1])
    for j in range(rows.shape[1]):
        series = rows[:, j]
        fixed = float(np.mean(np.square(series[burn:] - series.mean())))
        smoothers = {x: _smoother_error(series, x, burn) for x in LAMBDAS}
        best = min(smoothers, key=lambda x: smoothers[x])
        coefficient = _autocorrelation(series)
        returning = _ar_error(series, coefficient, burn) if coefficient < UNIT else math.inf
        if min(returning, smoothers[best]) >= gain * fixed:
            continue
        if returning <= smoothers[best]:
            phi[j] = coefficient
        else:
            lam[j] = best
    return lam, phi


def _autocorrelation(series: np.ndarray) -> float:
    """The lag-one autocorrelation (0 for a field that never moved), at least 0."""
    centred = series - series.mean()
    power = float(centred @ centred)
    return max(0.0, float(centred[1:] @ centred[:-1]) / power) if power > 0 else 0.0


def _ar_error(series: np.ndarray, phi: float, burn: int) -> float:
    centred = series - series.mean()
    errors = centred[1:] - phi * centred[:-1]
    return float(np.mean(np.square(errors[max(burn - 1, 0) :])))


def _smoother_error(series: np.ndarray, lam: float, burn: int) -> float:
    forecast = float(series[: max(burn, 1)].mean())
    total = 0.0
    for i, value in enumerate(series):
        if i >= burn:
            total += (value - forecast) ** 2
        forecast += lam * (value - forecast)
    return total / max(len(series) - burn, 1)


def fit_normal(
    rows: Sequence[Sequence[float]] | np.ndarray,
    fields: tuple[str, ...],
    *,
    smoothing: float,
    gain: float,
    clip: float = 6.0,
) -> tuple[Normal, np.ndarray]:
    """The normal of ``rows`` (readings in time order, one column per field) and the
    smoothed standardized innovation (clipped at ``clip``) at its last reading, where a
    chart continues.

    ValueError when there are too few rows to fit (fewer than 16)."""
    data = np.asarray(rows, dtype=float)
    if data.ndim != 2 or data.shape[1] != len(fields) or len(data) < 16:
        raise ValueError(f"fitting a normal needs at least 16 readings of {len(fields)} fields")
    burn = max(2, len(data) // 8)
    lam, phi = choose_forecasts(data, gain, burn)
    mean = data.mean(axis=0)
    forecast = np.where(lam > 0, data[:burn].mean(axis=0), mean)
    previous = mean.copy()
    errors = np.empty_like(data)
    for i, row in enumerate(data):
        errors[i] = row - (forecast + phi * (previous - forecast))
        forecast = forecast + lam * (row - forecast)
        previous = row
    errors = errors[burn:]
    spread = errors.std(axis=0)
    sd = np.where(spread > 0, spread, np.maximum(np.abs(mean) * 1e-6, 1e-9))
    white = math.sqrt(smoothing / (2 - smoothing))
    z = np.zeros(len(fields))
    smoothed = np.empty_like(errors)
    for i, e in enumerate(errors):
        z = smoothing * np.clip(e / sd, -clip, clip) + (1 - smoothing) * z
        smoothed[i] = z
    settled = smoothed[min(len(smoothed) - 1, int(2 / smoothing)) :]
    inflation = np.sqrt(np.maximum(1.0, settled.var(axis=0) / white**2))
    level = np.where(lam > 0, forecast, mean)
    normal = Normal(fields, lam, phi, level, sd, white * inflation, smoothing, len(data))
    return normal, z


ARTIFACT = "spanflow-normals"


@dataclass
class Normals:
    """One model version of format ``normal``: a fitted normal per key, fitted from a
    stream's history by ``spanflow detector fit`` (keys named as rebaselines name them:
    a compound key's values joined by commas). Plain JSON, no code: a file that is not
    one is refused (:meth:`from_bytes`)."""

    fields: tuple[str, ...]
    keys: dict[str, Normal]
    note: str = ""

    def to_bytes(self) -> bytes:
        import orjson

        return orjson.dumps(
            {
                "kind": ARTIFACT,
                "fields": list(self.fields),
                "keys": {k: n.plain() for k, n in sorted(self.keys.items())},
                "note": self.note,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Normals:
        """The normals of a ``normal`` model file (ValueError when it is not one)."""
        import orjson

        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"a normal model is JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("kind") != ARTIFACT:
            raise ValueError(f"not a {ARTIFACT} file (spanflow detector fit writes them)")
        fields = tuple(str(f) for f in doc.get("fields") or ())
        keys = doc.get("keys")
        if not fields or not isinstance(keys, dict):
            raise ValueError("a normal model names its fields and has a normal per key")
        out = {}
        for key, plain in keys.items():
            normal = Normal.from_plain(plain)
            if normal.fields != fields:
                raise ValueError(
                    f"key {key!r}: fitted on {list(normal.fields)}, not {list(fields)}"
                )
            out[str(key)] = normal
        return cls(fields, out, str(doc.get("note") or ""))
