"""spanflow's default anomaly detector: two streaming predictors, an anomaly
likelihood over each one's errors, and a check for values beyond any seen before.

Real series wander, change their variance, have cycles of unknown length and long
quiet stretches. A detector that scores the size of one error flags a third of
them; this one asks instead *how unlikely is the recent run of errors, given the
errors this key usually makes* — Numenta's anomaly likelihood (Ahmad et al., 2017),
over cheap predictors instead of HTM. Per field:

1. **Two predictors**, each giving a raw error in [0, 1], ``|residual| / (K sigma)``
   capped at 1, where sigma is the predictor's own clipped mean absolute residual:

   * *level*: an exponentially weighted level over about ``LEVEL_SPAN`` readings
     whose updates are clipped at ``CLIP`` sigma (a spike barely moves it; a new level
     is followed);
   * *cycle*: a slower level (``CYCLE_SPAN``) plus a profile of ``PROFILE_BUCKETS``
     offsets over the period :mod:`~spanflow.ml.seasonality` finds in the data (or
     the ``seasonality`` given); with no period, a second, slower level predictor.
     A value normal at noon but not at midnight stands out here.

2. **Likelihood** of each predictor's errors: the mean raw error over the last 10,
   30 and 100 readings, each compared with the distribution of that mean (an
   exponentially weighted mean and variance over about ``HISTORY_SPAN`` readings,
   floored as Numenta's are). The tail probability ``p`` of the recent mean becomes
   the score ``log(p) / log(1e-10)``: 0.5 at ``p = 1e-5``, 1 at ``p = 1e-10``. After
   a first alarm (``p <= 1e-5``), a run of alarms scores 0.3 (Numenta's filter), so
   a level shift alarms when it starts and not on every reading after.

3. **Beyond the range**: a value more than ``EXTREME`` (5 %) of the range seen so far
   below its minimum or above its maximum scores 1 (Numenta's "spatial" check) — with
   ``extreme_sigma`` above 0, only when it is also that many of the level predictor's
   sigmas from its level: a sensor with Gaussian noise and a slow drift widens its range
   by noise at the edge, which then alarms (docs/ml.md).

4. **Stuck** (off by default): with ``stuck`` above 0, a value repeated, exactly, for
   more readings than ``stuck``, than twice the longest run of one value the field has
   had, and than its rate of repeats makes likely (``rate ** run`` below ``RED``)
   scores 1, once per run: a frozen sensor reports a plausible value forever, which no
   check of size sees. A field that repeats by nature (counts, set points, plateaus)
   has long runs and a high rate, and only a run far beyond them alarms. (Off by
   default: on NAB's series, where plateaus are normal, it costs 2 to 4 points held
   out; docs/benchmarks.md.)

5. **Far from the level** (off by default): with ``sigma`` above 0, a value more than
   that many of the level predictor's sigmas from its level scores 1 — a Shewhart
   chart, for sensors whose noise is Gaussian around a slow level, where a range
   widened by an earlier fault would hide the next one. With ``confirm`` above 0, an
   alarm of the likelihood (2.) needs a value at least that many sigmas from the level:
   the tail of a window's mean error is heavier than the normal one its probability
   assumes, so on many quiet sensors an ordinary reading now and then completes an
   "unlikely" run; a real fault is also a reading out of the ordinary.

A field's score is the largest of these; the record's, the largest of its fields'.
After a record scores 0.5 or more, the next ``REST`` records' scores are halved, so
one episode is one alarm rather than a flood (a new extreme still reaches 0.5).
The first ``LEARN`` readings of a field score 0 while it learns.

The state is plain data (numbers, short lists), kept as Spark keyed state; all of it
is deterministic, so a replay after a crash gives the same scores. On the Numenta
Anomaly Benchmark, one set of these defaults for every series, see
docs/benchmarks.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from spanflow.ml.detector import Detector
from spanflow.ml.seasonality import PeriodFinder, phase_bucket

LEVEL_SPAN = 500  # readings the level predictor averages over
CYCLE_SPAN = 2000  # readings the cycle predictor's level averages over
K = 2.0  # a residual of K sigma is a raw error of 1
CLIP = 3.0  # updates clipped at this many sigma
SIGMA_PER_MAD = 1.2533  # sigma of a normal distribution per mean absolute deviation
PROFILE_BUCKETS = 48  # offsets per period (half-hourly for a day)
PROFILE_RATE = 0.1  # share of the residual a profile bucket learns per reading
WINDOWS = (10, 30, 100)  # readings whose mean raw error is judged
HISTORY_SPAN = 3000  # readings the distribution of mean errors is estimated over
MIN_MEAN, MIN_VAR = 0.03, 0.0003  # floors of that distribution (Numenta's)
RED = 1e-5  # tail probability of an alarm: score 0.5
REPEAT = 0.3  # score of an alarm right after an alarm (Numenta's yellow, p = 1e-3)
EXTREME = 0.05  # beyond the seen range by this share of it: score 1
EXTREME_SIGMA = 0.0  # ... and this many sigma from the level (0: no such condition)
STUCK = 0  # readings of one value, at least, before a field is stuck (0: no check)
SIGMA = 0.0  # a value this many sigma from the level scores 1 (0: no such check)
CONFIRM = 0.0  # a likelihood alarm needs a value this many sigma from the level (0: not)
REST = 100  # records after an alarm whose scores are halved
LEARN = 300  # readings of a field before it scores
ALARM = 0.5  # the score of an alarm, and the default threshold
_LOG_FLOOR = math.log(1e-10)
RED_Z = 4.264890793922825  # the distance in standard deviations whose tail is RED
_SQRT_HALF = math.sqrt(0.5)
_WINDOW_INDEX = tuple(enumerate(WINDOWS))


def score_of_probability(p: float) -> float:
    """``log(p) / log(1e-10)`` in [0, 1]: 0.5 at p = 1e-5."""
    return min(1.0, math.log(p + 1e-10) / _LOG_FLOOR)


class LikelihoodDetector(Detector):
    """Per-field predictors and likelihoods; see the module docstring."""

    def __init__(
        self,
        fields: tuple[str, ...],
        seasonality: float | None = None,
        *,
        detect_period: bool = True,
        learn: int = LEARN,
        rest: int = REST,
        extreme: float | None = EXTREME,
        extreme_sigma: float = EXTREME_SIGMA,
        stuck: int = STUCK,
        sigma: float = SIGMA,
        confirm: float = CONFIRM,
        level_span: int = LEVEL_SPAN,
        cycle_span: int = CYCLE_SPAN,
        history_span: int = HISTORY_SPAN,
    ) -> None:
        self.fields = fields
        self.period = seasonality
        self.detect_period = detect_period and seasonality is None
        self.learn = learn
        self.rest = rest
        self.extreme = extreme
        self.extreme_sigma = extreme_sigma
        self.stuck = stuck
        self.sigma = sigma
        self.confirm = confirm
        self.level_alpha = 2.0 / (level_span + 1)
        self.cycle_alpha = 2.0 / (cycle_span + 1)
        self.history_alpha = 2.0 / (history_span + 1)
        self.finder = PeriodFinder()

    # -- Detector protocol -------------------------------------------------------
    def load(self, state: Any) -> Any:
        return state if state is not None else {"quiet": 0, "f": {}}

    def save(self, live: Any) -> Any:
        return live

    def step(
        self, live: Any, record: Mapping[str, Any], at: datetime | None
    ) -> tuple[float, str | None]:
        best, best_field = 0.0, None
        for name in self.fields:
            value = record.get(name)
            # Missing, null, NaN, infinite or not a number: this field is not scored
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            x = float(value)
            if not math.isfinite(x):
                continue
            s = live["f"].get(name)
            if s is None:
                s = live["f"][name] = self._new_field(x)
            score = self._field_step(s, x, at)
            if score > best or best_field is None:
                best, best_field = score, name
        if live["quiet"] > 0:
            live["quiet"] -= 1
            best *= 0.5
        elif best >= ALARM:
            live["quiet"] = self.rest
        return best, best_field

    def period_of(self, live: Any, field: str) -> float | None:
        """The period the ``field``'s cycle predictor uses (None: no cycle)."""
        s = live["f"].get(field)
        return None if s is None else s["cycle"]["period"]

    # -- one field ------------------------------------------------------------------
    def _new_field(self, x: float) -> dict[str, Any]:
        return {
            "n": 0,
            "lo": x,
            "hi": x,
            "level": {"n": 0, "level": x, "mad": 0.0},
            "cycle": {
                "n": 0,
                "level": x,
                "lmad": 0.0,
                "mad": 0.0,
                "period": self.period,
                "at": 0.0,  # phases are counted from here
                "prof": [None] * (PROFILE_BUCKETS if self.period else 1),
                "w": [0] * (PROFILE_BUCKETS if self.period else 1),
            },
            "seas": self.finder.empty() if self.detect_period else None,
            # per predictor: recent raw errors, their sums per window, and per window
            # the (mean, variance, last was an alarm) of the mean error
            "lik": [_new_likelihood(), _new_likelihood()],
        }

    def _field_step(self, s: dict[str, Any], x: float, at: datetime | None) -> float:
        n = s["n"] = s["n"] + 1
        t = at.timestamp() if at is not None else float(n)
        level_raw = self._level_error(s["level"], x)
        cycle_raw = self._cycle_error(s, x, t)
        if s["seas"] is not None and self.finder.add(s["seas"], x, t):
            self._new_period(s, t)
        lik = s["lik"]
        score = self._likelihood(lik[0], level_raw)
        other = self._likelihood(lik[1], cycle_raw)
        if other > score:
            score = other
        if self.confirm > 0 and score > REPEAT and not self._beyond(s["level"], x, self.confirm):
            score = REPEAT  # an unlikely run of errors, but this reading is ordinary
        lo, hi = s["lo"], s["hi"]
        if self.extreme is not None and hi > lo:
            margin = (hi - lo) * self.extreme
            if (x > hi + margin or x < lo - margin) and self._far(s["level"], x):
                score = 1.0
        if x < lo:
            s["lo"] = x
        elif x > hi:
            s["hi"] = x
        if (self.stuck > 0 and self._stuck(s, x, n)) or (
            self.sigma > 0 and n > self.learn and self._beyond(s["level"], x, self.sigma)
        ):
            score = 1.0
        return score

    def _stuck(self, s: dict[str, Any], x: float, n: int) -> bool:
        """Count the run of one value that ``x`` extends or interrupts; whether the
        run has just become longer than the field's runs make likely (once per run).

        A run is counted as a majority vote: a reading of the value adds one, another
        reading takes one away, and the run ends at zero. Readings ordered by event
        time interleave a frozen sensor's with the last good ones, which a count of
        consecutive equal values would never see."""
        if "run" not in s:  # the check's first reading of the field: runs count from here
            s.update(_new_runs())
        if x == s["last"]:
            s["run"] += 1
            s["same"] += 1
        elif s["run"] > 1:
            s["run"] -= 1
        else:  # the run is over: unless it alarmed, it is one of the field's own
            if not s["flat"]:
                s["longest"] = max(s["longest"], s["peak"])
            s["run"], s["peak"], s["last"], s["flat"] = 1, 1, x, False
        run = s["run"]
        s["peak"] = max(s["peak"], run)
        if s["flat"] or n <= self.learn:
            return False
        if run <= max(self.stuck, 2 * s["longest"]):
            return False
        if ((s["same"] + 1) / (n + 1)) ** run > RED:
            return False
        s["flat"] = True
        return True

    def _far(self, p: dict[str, Any], x: float) -> bool:
        """Whether ``x`` is more than ``extreme_sigma`` of the level predictor's
        sigma from its level."""
        if self.extreme_sigma <= 0:
            return True
        return self._beyond(p, x, self.extreme_sigma)

    @staticmethod
    def _beyond(p: dict[str, Any], x: float, sigmas: float) -> bool:
        """Whether ``x`` is more than ``sigmas`` of the level predictor's sigma from
        its level."""
        return abs(x - p["level"]) > sigmas * SIGMA_PER_MAD * p["mad"]

    def _level_error(self, p: dict[str, Any], x: float) -> float:
        n = p["n"] = p["n"] + 1
        residual = x - p["level"]
        mad = p["mad"]
        raw, limit = _raw_error(residual, mad, n)
        alpha = self.level_alpha if n * self.level_alpha > 1.0 else 1.0 / n
        size = -residual if residual < 0 else residual
        if size > limit:
            residual = limit if residual > 0 else -limit
            size = limit
        p["level"] += alpha * residual
        p["mad"] = mad + alpha * (size - mad)
        return raw

    def _cycle_error(self, s: dict[str, Any], x: float, t: float) -> float:
        p = s["cycle"]
        n = p["n"] = p["n"] + 1
        base = p["level"]
        # The slow level: clipped like the level predictor's, with its own scale
        away = x - base
        _, limit = _raw_error(away, p["lmad"], n)
        slow = self.cycle_alpha if n * self.cycle_alpha > 1.0 else 1.0 / n
        size = -away if away < 0 else away
        if size > limit:
            away = limit if away > 0 else -limit
            size = limit
        p["level"] = base + slow * away
        p["lmad"] += slow * (size - p["lmad"])
        # One offset per phase of the cycle; without a cycle, one offset that follows
        # the recent residual (a faster predictor than the level's)
        bucket = phase_bucket(t, p["period"], PROFILE_BUCKETS, p["at"]) if p["period"] else 0
        profile = p["prof"]
        offset = profile[bucket]
        if offset is None:  # a bucket's first reading sets it
            profile[bucket] = x - base
            p["w"][bucket] = 1
            return 0.0
        residual = x - base - offset
        mad = p["mad"]
        raw, limit = _raw_error(residual, mad, n)
        size = -residual if residual < 0 else residual
        if size > limit:
            residual = limit if residual > 0 else -limit
            size = limit
        alpha = self.level_alpha if n * self.level_alpha > 1.0 else 1.0 / n
        p["mad"] = mad + alpha * (size - mad)
        weights = p["w"]
        weights[bucket] += 1
        rate = PROFILE_RATE if weights[bucket] * PROFILE_RATE > 1.0 else 1.0 / weights[bucket]
        profile[bucket] = offset + rate * residual
        return raw

    def _new_period(self, s: dict[str, Any], t: float) -> None:
        """Use the period just found at time ``t``. A refinement (within 10 %) keeps
        the profile, and moves the anchor so that the phase at ``t`` stays where it
        was; a new period starts a profile from the finder's history."""
        p, found = s["cycle"], s["seas"]["period"]
        old = p["period"]
        p["period"] = found
        if old is not None and abs(found - old) < 0.1 * old:
            p["at"] = t - (t - p["at"]) / old * found
            return
        p["at"] = t
        profile = self.finder.profile(s["seas"], PROFILE_BUCKETS, t)
        p["prof"] = profile or [None] * PROFILE_BUCKETS
        p["w"] = [0 if v is None else 1 for v in p["prof"]]
        # The errors made without the cycle say nothing of the errors to come: the
        # predictor's scale and its likelihood learn afresh
        p["n"], p["mad"] = 0, 0.0
        s["lik"][1] = _new_likelihood()

    def _likelihood(self, e: dict[str, Any], raw: float) -> float:
        """Score the recent mean errors against their own history, then learn them.

        ``e`` holds the recent raw errors, their running sum per window and, per
        window, the (mean, variance, last was an alarm) of its mean error. The tail
        probability falls as the distance from the mean grows, so only the largest
        distance is turned into a score. (The hot path of every detection: written
        for speed, with locals.)"""
        errors, sums, dist = e["r"], e["s"], e["d"]
        n = e["n"] = e["n"] + 1
        errors.append(raw)
        k = len(errors)
        alpha = self.history_alpha if n * self.history_alpha > 1.0 else 1.0 / n
        keep = 1.0 - alpha
        scoring = n > self.learn
        farthest, repeated = -1.0, False
        for j, window in _WINDOW_INDEX:
            total = sums[j] + raw
            if k > window:  # the error that leaves the window
                total -= errors[k - 1 - window]
            sums[j] = total
            mean_error = total / (k if k < window else window)
            d = dist[j]
            mean, var = d[0], d[1]
            if scoring:
                z = abs(mean_error - (mean if mean > MIN_MEAN else MIN_MEAN)) / math.sqrt(
                    var if var > MIN_VAR else MIN_VAR
                )
                red = z >= RED_Z
                if red and d[2]:
                    repeated = True
                elif z > farthest:
                    farthest = z
                d[2] = red
            delta = mean_error - mean
            d[0] = mean + alpha * delta
            d[1] = keep * (var + alpha * delta * delta)
        if k > WINDOWS[-1]:
            del errors[0]
        if farthest < 0:
            return REPEAT if repeated else 0.0
        score = score_of_probability(0.5 * math.erfc(farthest * _SQRT_HALF))
        return max(score, REPEAT) if repeated else score


def _new_likelihood() -> dict[str, Any]:
    """A predictor's likelihood state: readings seen, recent raw errors, their sums
    per window, and per window the (mean, variance, last was an alarm) of the mean
    error."""
    return {
        "n": 0,
        "r": [],
        "s": [0.0] * len(WINDOWS),
        "d": [[0.0, 0.0, False] for _ in WINDOWS],
    }


def _new_runs() -> dict[str, Any]:
    """A field's runs of equal values: the value of the run, the run's count and
    its highest, the longest run the field has had, how many readings repeated the
    run's value, and whether this run alarmed."""
    return {"last": None, "run": 0, "peak": 0, "longest": 0, "same": 0, "flat": False}


def _raw_error(residual: float, mad: float, n: int) -> tuple[float, float]:
    """(raw error in [0, 1], clip limit for the update) of a residual."""
    sigma = mad * SIGMA_PER_MAD
    if sigma <= 0:  # no spread yet: any change is a full error
        return (0.0 if residual == 0 else 1.0), math.inf
    raw = min(1.0, abs(residual) / (K * sigma))
    return raw, (CLIP * sigma if n > 10 else math.inf)
