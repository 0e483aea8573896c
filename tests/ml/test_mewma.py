"""The ``mewma`` method (the textbook chart) without Spark: it sees fields that stop moving together
although each stays in its own range, keeps a fault flagged while it lasts without
learning it, lets it go when it is undone, accepts a new normal only when told, and its
state survives being saved between every batch."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from spanflow.ml.anomaly import judge
from spanflow.ml.detectors import make_detector
from spanflow.ml.mewma import MewmaDetector
from spanflow.ml.thresholds import make_threshold
from spanflow.spec.steps.models import DetectAnomaliesStep

FIELDS = ("current", "flow", "pressure")
WARMUP = 300
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _pump(n: int, seed: int = 3) -> list[dict]:
    """A pump whose flow and pressure follow its current, with sensor noise."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        load = rng.gauss(0, 1)
        out.append(
            {
                "ts": T0 + timedelta(seconds=i),
                "current": 10 + load + rng.gauss(0, 0.1),
                "flow": 30 + 2 * load + rng.gauss(0, 0.2),
                "pressure": 5 + 0.5 * load + rng.gauss(0, 0.05),
            }
        )
    return out


def _flags(rows: list[dict], **params: object) -> list[tuple[float, bool, str | None]]:
    step = DetectAnomaliesStep(id="d", fields=FIELDS, method="mewma", warmup=WARMUP)
    detector = make_detector("mewma", FIELDS, {**step.detector_params(), **params}, None)
    threshold = make_threshold(step.threshold_or_default)
    times = [r["ts"] for r in rows]
    return judge(detector, detector.load(None), threshold, {}, rows, times, WARMUP)


def test_fields_that_stop_moving_together_are_found_though_each_stays_in_range() -> None:
    rows = _pump(1500)
    for r in rows[900:1100]:  # the flow no longer follows the current: a blocked inlet
        r["flow"] = 60 - r["flow"]  # 30 +- 2 * load, mirrored: the same range
    verdicts = _flags(rows)
    fault = verdicts[900:1100]
    before = verdicts[WARMUP:900]
    assert sum(flag for _, flag, _ in fault) >= 0.9 * len(fault)
    assert sum(flag for _, flag, _ in before) <= 0.01 * len(before)
    named = Counter(field for _, flag, field in fault if flag)
    assert named.most_common(1)[0][0] == "flow", named  # the sensor that moved
    # each field alone stays inside the range it had before
    for name in FIELDS:
        normal = [r[name] for r in rows[:900]]
        assert all(min(normal) - 1 <= r[name] <= max(normal) + 1 for r in rows[900:1100])


def test_a_fault_stays_flagged_while_it_lasts_is_not_learnt_and_ends_when_undone() -> None:
    rows = _pump(2400)
    for r in rows[1000:1600]:  # ten minutes of low pressure
        r["pressure"] -= 1.0
    step = DetectAnomaliesStep(id="d", fields=FIELDS, method="mewma", warmup=WARMUP)
    detector = MewmaDetector(FIELDS, **step.detector_params())
    live = detector.load(None)
    flags, means = [], []
    for r in rows:
        score, _ = detector.step(live, r, None)
        flags.append(score >= 0.5)
        assert live.mu is not None or len(flags) <= WARMUP
        means.append(None if live.mu is None else live.mu.copy())
    assert not any(flags[WARMUP:1000])
    onset = flags.index(True, 1000)
    assert onset < 1010  # found within seconds
    assert all(flags[onset:1600])  # flagged for as long as the fault lasts
    assert (means[1599] == means[onset]).all()  # nothing of the fault was learnt
    end = flags.index(False, 1600)
    assert end <= 1600 + detector.settle + 10  # let go once undone and settled
    assert not any(flags[end:])


def test_a_new_normal_is_accepted_after_accept_after_readings_only() -> None:
    rows = _pump(2000)
    for r in rows[800:]:  # the pump is moved to a new duty point for good
        r["current"] += 1.5
        r["flow"] += 3.0
        r["pressure"] += 0.75
    held = _flags(rows)
    assert all(flag for _, flag, _ in held[820:])  # by default never by itself
    accepted = _flags(rows, accept_after=200)
    flagged = [flag for _, flag, _ in accepted]
    assert all(flagged[820:990]) and not any(flagged[1100:])


def test_state_saved_between_every_batch_gives_the_same_scores() -> None:
    rows = _pump(1200)
    for r in rows[700:900]:
        r["flow"] += 4
    detector = MewmaDetector(FIELDS, warmup=WARMUP)
    whole = detector.load(None)
    expected = [detector.step(whole, r, None) for r in rows]
    state = None
    got = []
    for lo in range(0, len(rows), 37):
        live = detector.load(state)
        got += [detector.step(live, r, None) for r in rows[lo : lo + 37]]
        state = orjson.loads(orjson.dumps(detector.save(live)))  # as the state store keeps it
    assert got == expected


def test_bad_readings_and_parameters() -> None:
    detector = MewmaDetector(FIELDS, warmup=WARMUP)
    live = detector.load(None)
    for r in _pump(WARMUP):
        detector.step(live, r, None)
    for bad in ({"current": None, "flow": 1, "pressure": 1}, {"flow": 1}, {"current": "x"}):
        assert detector.step(live, bad, None) == (0.0, None)  # no score, nothing learnt
    assert detector.step(live, {"current": float("nan"), "flow": 1, "pressure": 1}, None)[0] == 0
    with pytest.raises(ValueError, match=r"unknown parameter.*smoothing"):
        MewmaDetector(FIELDS, smothing=0.2)
    with pytest.raises(ValueError, match="smoothing"):
        MewmaDetector(FIELDS, smoothing=0)
    step = DetectAnomaliesStep(id="d", fields=FIELDS, method="mewma")
    assert step.warmup_or_default == 200 and step.threshold_or_default == 0.5
    assert step.detector_params() == {"warmup": 200}
