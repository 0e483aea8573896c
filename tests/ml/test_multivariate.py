"""The ``multivariate`` method (the default over two or more fields) without Spark: it
learns which sensors hover and which wander, finds a fault of one sensor while the others
drift, keeps it while it lasts without learning it, lets it go when it is undone (even
when the machine does not come back exactly), ignores a single noisy reading, and its
state survives being saved between every batch."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import orjson
import pytest

from spanflow.ml.anomaly import judge
from spanflow.ml.detectors import make_detector
from spanflow.ml.multivariate import MultivariateDetector
from spanflow.ml.normal import Normal, fit_normal
from spanflow.ml.thresholds import make_threshold
from spanflow.spec.steps.models import DetectAnomaliesStep

FIELDS = ("current", "flow", "pressure", "temperature")
WARMUP = 400


def _pump(n: int, seed: int = 3, drift: float = 0.02) -> list[dict]:
    """A pump: current, flow and pressure hover around their set points with noise; the
    motor's temperature wanders smoothly as it warms up (a random walk on a slow rise:
    far more, over an hour, than anything its warm-up shows)."""
    rng = random.Random(seed)
    out, temperature = [], 60.0
    for _ in range(n):
        temperature += 0.002 + rng.gauss(0, drift)
        out.append(
            {
                "current": 10 + rng.gauss(0, 0.3),
                "flow": 32 + rng.gauss(0, 0.5),
                "pressure": 5 + rng.gauss(0, 0.1),
                "temperature": temperature + rng.gauss(0, 0.01),
            }
        )
    return out


def _verdicts(rows: list[dict], **params: object) -> list[tuple[float, bool, str | None]]:
    step = DetectAnomaliesStep(id="d", fields=FIELDS)
    assert step.method_or_default == "multivariate" and step.warmup_or_default == WARMUP
    detector = make_detector("multivariate", FIELDS, {**step.detector_params(), **params}, None)
    threshold = make_threshold(step.threshold_or_default)
    return judge(detector, detector.load(None), threshold, {}, rows, None, WARMUP)


def _flags(verdicts: list[tuple[float, bool, str | None]]) -> list[bool]:
    return [flag for _, flag, _ in verdicts]


def test_a_wandering_temperature_is_no_alarm_but_a_flow_drop_is() -> None:
    rows = _pump(3000)
    for r in rows[1500:2000]:  # the inlet valve half closed: the flow drops a little
        r["flow"] -= 1.0
    verdicts = _verdicts(rows)
    flags = _flags(verdicts)
    temperatures = [r["temperature"] for r in rows]
    warm = temperatures[:WARMUP]
    assert max(temperatures) - min(temperatures) > 5 * (max(warm) - min(warm))  # it wanders
    assert not any(flags[WARMUP:1500])  # ... and that is normal
    onset = flags.index(True, 1500)
    assert onset < 1530  # found within half a minute at 1 Hz
    assert all(flags[onset:2000])  # held while it lasts
    named = Counter(field for _, flag, field in verdicts[1500:2000] if flag)
    assert named.most_common(1)[0][0] == "flow"
    assert not any(flags[2000 + 60 :])  # let go once undone


def test_a_fault_undone_where_the_machine_does_not_return_exactly_is_let_go() -> None:
    rows = _pump(3000)
    for r in rows[1500:2000]:
        r["flow"] -= 3.0  # closed hard
    for r in rows[2000:]:
        r["flow"] += 0.5  # reopened a little wider than before
    flags = _flags(_verdicts(rows))
    assert all(flags[1510:2000])
    assert not any(flags[2000 + 60 :])  # the new level is taken after settling


def test_one_noisy_reading_is_no_episode_but_a_fault_of_one_field_is_not_diluted() -> None:
    rows = _pump(2000)
    rows[1000]["pressure"] += 5.0  # a glitch: fifty sigma, once
    flags = _flags(_verdicts(rows))
    assert not any(flags[WARMUP:])
    for r in rows[1500:]:
        r["pressure"] += 0.2  # two sigma, for good: one field of four
    assert any(_flags(_verdicts(rows))[1500:1560])


def test_a_fault_is_not_learnt_and_a_new_normal_only_when_accepted() -> None:
    rows = _pump(3000)
    for r in rows[1200:]:  # moved to another duty point for good
        r["current"] += 2.0
        r["pressure"] += 0.5
    held = _flags(_verdicts(rows))
    assert all(held[1220:])  # by default never by itself
    accepted = _flags(_verdicts(rows, accept_after=300))
    assert all(accepted[1220:1490]) and not any(accepted[1600:])


def test_state_saved_between_every_batch_gives_the_same_scores() -> None:
    rows = _pump(1500)
    for r in rows[900:1100]:
        r["flow"] += 4
    detector = MultivariateDetector(FIELDS, warmup=WARMUP)
    whole = detector.load(None)
    expected = [detector.step(whole, r, None) for r in rows]
    state, got = None, []
    for lo in range(0, len(rows), 37):
        live = detector.load(state)
        got += [detector.step(live, r, None) for r in rows[lo : lo + 37]]
        state = orjson.loads(orjson.dumps(detector.save(live)))  # as the state store keeps it
    assert got == expected
    assert any(score >= 0.5 for score, _ in expected[900:1100])


def test_what_the_warmup_learns() -> None:
    rows = np.array([[r[f] for f in FIELDS] for r in _pump(WARMUP)])
    normal, _ = fit_normal(rows, FIELDS, smoothing=0.1, gain=0.8)
    lam = dict(zip(FIELDS, normal.lam, strict=True))
    assert lam["current"] == lam["flow"] == lam["pressure"] == 0  # levels
    assert lam["temperature"] > 0.5  # a smoother: judged by its surprises
    assert Normal.from_plain(orjson.loads(orjson.dumps(normal.plain()))).plain() == normal.plain()
    for broken in ({}, {**normal.plain(), "sd": [0, 1, 1, 1]}, {**normal.plain(), "format": 9}):
        with pytest.raises(ValueError, match=r"not a fitted normal|format"):
            Normal.from_plain(broken)


def test_bad_readings_parameters_and_an_old_state() -> None:
    detector = MultivariateDetector(FIELDS, warmup=WARMUP)
    live = detector.load(None)
    for r in _pump(WARMUP):
        detector.step(live, r, None)
    good = dict(_pump(1)[0])
    for bad in ({**good, "flow": None}, {"flow": 1}, {**good, "current": "x"}):
        assert detector.step(live, bad, None) == (0.0, None)
    assert detector.step(live, {**good, "current": float("nan")}, None)[0] == 0
    with pytest.raises(ValueError, match=r"unknown parameter.*smoothing"):
        MultivariateDetector(FIELDS, smothing=0.2)
    with pytest.raises(ValueError, match="persist"):
        MultivariateDetector(FIELDS, persist=11, window=10)
    # the state of the chart this method was before (MEWMA): the key learns afresh
    old = {"mu": [1.0] * 4, "inv": [[1.0] * 4] * 4, "z": [0.0] * 4, "limit": 3.0, "on": True}
    fresh = detector.load(old)
    assert fresh.normal is None and detector.step(fresh, good, None) == (0.0, None)


def test_a_lingering_field_is_fitted_as_an_ar1_and_a_lasting_shift_of_it_is_held() -> None:
    rng = random.Random(8)
    rows, vibration = _pump(2400), 0.0
    for i, r in enumerate(rows):
        vibration = 0.6 * vibration + rng.gauss(0, 0.01)  # comes back, but not at once
        r["vibration"] = 0.3 + vibration + (0.05 if 1200 <= i < 1800 else 0.0)
    fields = (*FIELDS, "vibration")
    normal, _ = fit_normal([[r[f] for f in fields] for r in rows[:WARMUP]], fields,
                           smoothing=0.1, gain=0.8)  # fmt: skip
    forecasts = dict(zip(fields, zip(normal.lam, normal.phi, strict=True), strict=True))
    assert forecasts["vibration"][0] == 0 and 0.4 < forecasts["vibration"][1] < 0.8
    detector = make_detector("multivariate", fields, {"warmup": WARMUP}, None)
    threshold = make_threshold(0.5)
    flags = [
        f for _, f, _ in judge(detector, detector.load(None), threshold, {}, rows, None, WARMUP)
    ]
    assert not any(flags[WARMUP:1200])
    assert sum(flags[1200:1800]) >= 0.9 * 600  # held while it lasts: not forecast away
    assert not any(flags[1800 + 60 :])


def _history_normal(rows: list[dict]) -> Normal:
    normal, _ = fit_normal([[r[f] for f in FIELDS] for r in rows], FIELDS, smoothing=0.1,
                           gain=0.8)  # fmt: skip
    return normal


def _batched(detector: MultivariateDetector, rows: list[dict], size: int = 23) -> list[float]:
    """Scores with the state saved between batches, as the state store keeps it."""
    state, scores = None, []
    for lo in range(0, len(rows), size):
        live = detector.load(state)
        scores += [detector.step(live, r, None)[0] for r in rows[lo : lo + size]]
        state = orjson.loads(orjson.dumps(detector.save(live)))
    return scores


def test_a_fitted_normal_judges_from_the_first_reading_unless_anchored() -> None:
    history = _history_normal(_pump(WARMUP, seed=7))
    today = _pump(1500, seed=8)
    for r in today:  # another operating point: every level a little higher
        r["flow"] += 3
        r["pressure"] += 0.5
    for r in today[900:1000]:  # and, later, a real fault
        r["current"] += 2
    judged = _batched(MultivariateDetector(FIELDS, model=history), today)
    assert min(judged[20:]) >= 0.5  # the history's levels: today is all anomaly
    anchored = _batched(MultivariateDetector(FIELDS, model=history, anchor=50), today)
    assert max(anchored[:50]) == 0  # the anchor's readings are not scored
    alarms = [i for i, s in enumerate(anchored) if s >= 0.5]
    assert alarms and 900 <= alarms[0] <= 920 and not [i for i in alarms if i < 900]


def test_an_anchored_normal_whose_spreads_are_not_the_keys_gives_way_to_online() -> None:
    history = _history_normal(_pump(WARMUP, seed=7))
    noisy = _pump(1500, seed=9)
    for r in noisy:  # the current three times as noisy as in the history
        r["current"] = 10 + (r["current"] - 10) * 3
    detector = MultivariateDetector(FIELDS, model=history, anchor=50, warmup=WARMUP)
    scores = _batched(detector, noisy)
    assert max(scores[:WARMUP]) == 0  # learning online: its warm-up, the anchor's first
    live = detector.load(None)
    for r in noisy[:50]:
        detector.step(live, r, None)
    assert live.online and live.normal is None and len(live.learning) == 50
    assert max(scores[WARMUP:]) < 0.5  # and its own normal holds its noise
    # a key like the history passes the check and is judged from reading 51
    like = MultivariateDetector(FIELDS, model=history, anchor=50)
    live = like.load(None)
    for r in _pump(50, seed=10):
        like.step(live, r, None)
    assert not live.online and live.normal is history and live.anchoring is None
    with pytest.raises(ValueError, match="anchor"):
        MultivariateDetector(FIELDS, anchor=-1)
