"""The ``multivariate`` method, and the default over two or more fields: learn a machine's
normal from its warm-up, chart each sensor's surprises, and keep a fault as a state.

1. **Learn normal** (:mod:`spanflow.ml.normal`): each field's one-step forecast — a
   fixed level for a sensor that hovers around a set point, an AR(1) around its level
   for one that lingers but comes back, an exponential smoother for one that wanders
   (a temperature) — fitted on the key's first ``warmup``
   readings, or taken from a model fitted on the key's history
   (``spanflow detector fit``).
2. **Chart the surprises**: each reading's innovation (reading minus forecast), in
   units of the field's innovation spread and clipped at ``clip`` of them (one wild
   reading counts as a large one, no more), is smoothed exponentially (``smoothing``);
   ``u`` is that, in units of its own spread on the warm-up. The reading's deviation is
   ``d = max |u|`` over the fields (a fault of one sensor is not diluted by the others'
   calm, as in a T-squared over all of them).
3. **Persistence**: an episode starts when ``d`` is over ``limit`` at ``persist`` of the
   last ``window`` readings — one noisy reading is not an alarm.
4. **Faults are states**: during an episode the fixed levels learn nothing, so a fault
   never becomes normal by itself. The episode keeps its *signature* (the typical ``u``
   while it is bad). It ends when for ``settle`` readings in a row either every field
   is back under the limit, or the deviation along the signature has fallen below
   ``release`` times its size and no other field is over the limit: the fault was
   undone, even if the machine does not come back exactly where it was. The levels of
   the fields that were part of the fault then move to those ``settle`` readings.
   ``accept_after: N`` takes an episode's readings as the new normal after N readings.
   While normal, fixed levels follow very slow drift (half-life ``adapt`` readings).

A normal fitted on the key's history is the normal the key is judged by from its first
reading: a machine that is faulty when the model is promoted is flagged at once. When
the history is of another operating point — another load, another day's water
temperature — its levels would flag every reading; ``anchor: N`` then takes the
levels from the key's first N readings (not scored) and checks the fit on them: when
a field's one-step errors spread more than twice, or less than half, as much as
fitted, the history is not this key's normal (it would alarm on the key's noise, or
hide its faults under the history's), and the key learns online from its warm-up,
those readings first. Either way a fault under way at the start becomes that key's
normal, so it is not the default.

"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any

import numpy as np

from spanflow.ml.detector import Detector, finite_vector
from spanflow.ml.normal import Normal, fit_normal

DEFAULTS: dict[str, Any] = {
    "smoothing": 0.1,
    "limit": 5.0,
    "persist": 5,
    "window": 10,
    "settle": 30,
    "release": 0.3,
    "gain": 0.8,
    "clip": 6.0,
    "adapt": 4000,
    "accept_after": None,
    "anchor": 0,
}
"""Documented in docs/ml.md, with the figures they were chosen by."""
SIGNATURE_RATE = 0.02
"""How fast an episode's signature follows its deviations (a half-life of ~35 readings)."""
SPREAD_FIT = 2.0
"""How far (a factor either way) a key's spreads may be from a fitted normal's."""
BELOW = 0.4999
"""The highest score outside an episode."""


@dataclass
class Live:
    """A key's working state (plain data out of :meth:`MultivariateDetector.save`)."""

    learning: list[list[float]] = field(default_factory=list)
    normal: Normal | None = None
    forecast: np.ndarray | None = None
    """Per field: its level (a smoother's state for a smoothed field)."""
    previous: np.ndarray | None = None
    z: np.ndarray | None = None
    over: int = 0
    """Bit i: the reading i back was over the limit."""
    anomalous: bool = False
    signature: np.ndarray | None = None
    calm: int = 0
    episode: int = 0
    recent: list[list[float]] = field(default_factory=list)
    anchoring: list[list[float]] | None = None
    """A fitted normal's first readings of the key, while they set its levels."""
    online: bool = False
    """The fitted normal did not fit the key, which learns online."""


class MultivariateDetector(Detector):
    """A learned normal per key and a persistent chart of its surprises (see the module)."""

    def __init__(
        self, fields: tuple[str, ...], *, warmup: int = 400, model: Normal | None = None,
        **params: Any,
    ) -> None:  # fmt: skip
        unknown = set(params) - set(DEFAULTS)
        if unknown:
            raise ValueError(
                f"unknown parameter(s) {sorted(unknown)} for method multivariate; "
                f"parameters: {', '.join(DEFAULTS)}"
            )
        p = {**DEFAULTS, **params}
        self.fields = fields
        self.warmup = max(int(warmup), 16)
        self.smoothing = float(p["smoothing"])
        self.limit = float(p["limit"])
        self.persist, self.window = int(p["persist"]), int(p["window"])
        self.settle = int(p["settle"])
        self.release = float(p["release"])
        self.gain = float(p["gain"])
        self.clip = float(p["clip"])
        self.adapt = float(p["adapt"] or 0)
        self.accept_after = None if p["accept_after"] is None else int(p["accept_after"])
        self.anchor = int(p["anchor"] or 0)
        self._check()
        self._drift = 1 - 0.5 ** (1 / self.adapt) if self.adapt > 0 else 0.0
        if model is not None and model.fields != fields:
            raise ValueError(f"the model is of fields {list(model.fields)}, not {list(fields)}")
        self.model = model

    def _check(self) -> None:
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing is in (0, 1], not {self.smoothing}")
        if self.limit <= 0 or self.settle < 1 or not 0 < self.release <= 1:
            raise ValueError("limit > 0, settle >= 1 and release in (0, 1] are required")
        if not 1 <= self.persist <= self.window <= 60:
            raise ValueError("1 <= persist <= window <= 60 is required")
        if not 0 < self.gain <= 1:
            raise ValueError(f"gain is in (0, 1], not {self.gain}")
        if self.clip <= 0:
            raise ValueError(f"clip is > 0, not {self.clip}")
        if self.anchor < 0:
            raise ValueError(f"anchor is >= 0, not {self.anchor}")

    # -- state ---------------------------------------------------------------------------
    def load(self, state: Any) -> Live:
        if not state or "normal" not in state:  # a new key (or the MEWMA state of before)
            live = Live(learning=(state or {}).get("learn", []) if state else [])
            live.online = bool(state and state.get("online"))
            if self.model is not None and not live.online:
                self._fitted_start(live, self.model)
            return live
        live = Live(
            normal=Normal.from_plain(state["normal"]),
            forecast=np.asarray(state["forecast"], dtype=float),
            previous=np.asarray(state["previous"], dtype=float),
            z=np.asarray(state["z"], dtype=float),
            over=int(state["over"]),
            anomalous=bool(state["on"]),
            calm=int(state["calm"]),
            episode=int(state["episode"]),
            recent=state["recent"],
        )
        if state.get("signature") is not None:
            live.signature = np.asarray(state["signature"], dtype=float)
        live.anchoring = state.get("anchoring")
        return live

    def save(self, live: Live) -> Any:
        if live.normal is None:
            return {"learn": live.learning, **({"online": True} if live.online else {})}
        assert live.forecast is not None and live.z is not None and live.previous is not None
        return {
            "normal": live.normal.plain(),
            "forecast": live.forecast.tolist(),
            "previous": live.previous.tolist(),
            "z": live.z.tolist(),
            "over": live.over,
            "on": live.anomalous,
            "signature": None if live.signature is None else live.signature.tolist(),
            "calm": live.calm,
            "episode": live.episode,
            "recent": live.recent,
            **({"anchoring": live.anchoring} if live.anchoring is not None else {}),
        }

    # -- scoring -------------------------------------------------------------------------
    def step(
        self, live: Live, record: Mapping[str, Any], at: datetime | None
    ) -> tuple[float, str | None]:
        x = finite_vector(record, self.fields)
        if x is None:  # a missing or non-finite field: no score, nothing learnt
            return 0.0, None
        if live.normal is None:
            live.learning.append(x.tolist())
            if len(live.learning) >= self.warmup:
                normal, z = fit_normal(
                    live.learning,
                    self.fields,
                    smoothing=self.smoothing,
                    gain=self.gain,
                    clip=self.clip,
                )
                self._start(live, normal, z)
            return 0.0, None
        if live.anchoring is not None:
            self._anchor(live, x)
            return 0.0, None
        u = self._deviation(live, x)
        d = float(np.max(np.abs(u)))
        self._track(live, x, u, d)
        score = d / (d + self.limit)
        score = max(score, 0.5) if live.anomalous else min(score, BELOW)
        return score, self.fields[int(np.argmax(np.abs(u)))]

    def started(self, normal: Normal) -> Any:
        """The state of a key that starts from a normal fitted elsewhere (its history):
        no warm-up, its chart at rest."""
        live = Live()
        self._fitted_start(live, normal)
        return self.save(live)

    def _start(self, live: Live, normal: Normal, z: np.ndarray) -> None:
        live.normal, live.forecast, live.z = normal, normal.level.copy(), z.copy()
        live.previous = normal.level.copy()
        live.learning = []

    def _fitted_start(self, live: Live, normal: Normal) -> None:
        """Start from a fitted normal: its levels first set by the key's first
        ``anchor`` readings (none: the fitted levels)."""
        self._start(live, normal, np.zeros(len(self.fields)))
        live.anchoring = [] if self.anchor > 0 else None

    def _anchor(self, live: Live, x: np.ndarray) -> None:
        """Keep one of the key's first readings; at ``anchor`` of them, the fixed
        levels become their mean and the smoothers run through them."""
        assert live.anchoring is not None and live.normal is not None
        live.anchoring.append(x.tolist())
        if len(live.anchoring) < self.anchor:
            return
        readings = np.asarray(live.anchoring, dtype=float)
        normal, forecast = live.normal, readings.mean(axis=0)
        moving = normal.moving
        smoothed = readings[0].copy()
        for row in readings[1:]:
            smoothed += normal.lam * (row - smoothed)
        forecast[moving] = smoothed[moving]
        if len(readings) >= 2 and not self._spreads_fit(readings, normal, forecast):
            # The fitted spreads are not this key's: learn online, these readings first
            live.normal, live.forecast, live.previous, live.z = None, None, None, None
            live.learning, live.anchoring, live.online = live.anchoring, None, True
            return
        live.forecast, live.previous, live.anchoring = forecast, readings[-1].copy(), None

    @staticmethod
    def _spreads_fit(readings: np.ndarray, normal: Normal, level: np.ndarray) -> bool:
        """Whether every field's one-step errors over the key's first readings spread
        within a factor ``SPREAD_FIT`` of the fitted spread: a noisier key would
        alarm on its noise, a quieter one hide its faults under the fitted noise."""
        ratio = _innovation_sd(readings, normal, level) / normal.sd
        return bool(np.all((ratio <= SPREAD_FIT) & (ratio >= 1 / SPREAD_FIT)))

    def _deviation(self, live: Live, x: np.ndarray) -> np.ndarray:
        """The smoothed standardized innovation in units of its warm-up spread; the
        forecasts then learn the reading (smoothers always; levels only slowly, and
        only while normal)."""
        normal, forecast, z = live.normal, live.forecast, live.z
        assert normal is not None and forecast is not None and z is not None
        assert live.previous is not None
        predicted = forecast + normal.phi * (live.previous - forecast)
        innovation = np.clip((x - predicted) / normal.sd, -self.clip, self.clip)
        z *= 1 - self.smoothing
        z += self.smoothing * innovation
        forecast += normal.lam * (x - forecast)
        live.previous = x
        if not live.anomalous and self._drift:
            fixed = ~normal.moving
            forecast[fixed] += self._drift * (x - forecast)[fixed]
        return z / normal.scale

    def _track(self, live: Live, x: np.ndarray, u: np.ndarray, d: float) -> None:
        """Open an episode on persistent deviation, hold it, let it go when undone."""
        live.over = ((live.over << 1) | int(d > self.limit)) & ((1 << self.window) - 1)
        if not live.anomalous:
            if live.over.bit_count() >= self.persist:
                live.anomalous, live.calm, live.episode = True, 0, 1
                live.signature, live.recent = u.copy(), []
            return
        assert live.signature is not None
        live.episode += 1
        live.recent = [*live.recent[-(self.settle - 1) :], x.tolist()]
        if self._calm(live.signature, u, d):
            live.calm += 1
        else:
            live.calm = 0
            live.signature += SIGNATURE_RATE * (u - live.signature)
        accepted = self.accept_after is not None and live.episode >= self.accept_after
        if live.calm >= self.settle or accepted:
            self._end(live, accepted)

    def _calm(self, signature: np.ndarray, u: np.ndarray, d: float) -> bool:
        """Every field under the limit; or the fault's own deviation mostly gone and
        nothing else over the limit."""
        if d < self.limit:
            return True
        size = float(np.linalg.norm(signature))
        if size == 0:
            return False
        along = float(u @ signature) / size
        rest = u - along * signature / size
        return along < self.release * size and float(np.max(np.abs(rest))) < self.limit

    def _end(self, live: Live, accepted: bool) -> None:
        """The episode is over: the levels of the fields in the fault (every level,
        when accepted) move to the latest readings."""
        normal, forecast = live.normal, live.forecast
        assert normal is not None and forecast is not None and live.signature is not None
        moved = ~normal.moving
        if not accepted:
            moved &= np.abs(live.signature) > self.limit
        if live.recent:
            forecast[moved] = np.asarray(live.recent, dtype=float).mean(axis=0)[moved]
        live.anomalous, live.calm, live.episode, live.over = False, 0, 0, 0
        live.signature, live.recent = None, []
        if live.z is not None:
            live.z[:] = 0


def _innovation_sd(readings: np.ndarray, normal: Normal, level: np.ndarray) -> np.ndarray:
    """Per field: the spread of the fitted forecasts' one-step errors over ``readings``
    (fixed levels at ``level``)."""
    errors = []
    smoothed = readings[0].copy()
    for previous, row in pairwise(readings):
        predicted = np.where(normal.moving, smoothed, level + normal.phi * (previous - level))
        errors.append(row - predicted)
        smoothed += normal.lam * (row - smoothed)
    return np.asarray(errors).std(axis=0)
