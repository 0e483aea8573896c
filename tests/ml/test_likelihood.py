"""The default detector (likelihood) and the period finder, without Spark."""

from __future__ import annotations

import csv
import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from spanflow.ml.anomaly import ADDED, AnomalyDetection, judge
from spanflow.ml.detectors import make_detector
from spanflow.ml.likelihood import LEARN, REST, LikelihoodDetector
from spanflow.ml.seasonality import PeriodFinder
from spanflow.ml.thresholds import make_threshold
from spanflow.testing import KeyedProcessorTest

T0 = datetime(2026, 1, 5, tzinfo=UTC)
NAB = Path(__file__).resolve().parents[1] / "data" / "nab"


def nab_series(name: str) -> tuple[list[datetime], list[float]]:
    with open(NAB / name) as f:
        rows = list(csv.DictReader(f))
    times = [datetime.fromisoformat(r["timestamp"]).replace(tzinfo=UTC) for r in rows]
    return times, [float(r["value"]) for r in rows]


def _scores(values, times=None, **params):
    detector = LikelihoodDetector(("x",), **params)
    live = detector.load(None)
    out = []
    for i, v in enumerate(values):
        out.append(detector.step(live, {"x": v}, times[i] if times else None)[0])
    return out, detector, live


def _noise(n: int, seed: int = 3, level: float = 10.0, sd: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [level + rng.gauss(0, sd) for _ in range(n)]


# -- the period finder ------------------------------------------------------------------


def _finder_period(values, times):
    finder = PeriodFinder()
    state = finder.empty()
    for v, t in zip(values, times, strict=True):
        finder.add(state, v, t)
    return state


def test_a_daily_cycle_is_found_in_minute_data_across_merges_of_the_history():
    rng = random.Random(1)
    times = [i * 60.0 for i in range(14 * 1440)]  # two weeks: the history merges 5 times
    values = [math.sin(2 * math.pi * t / 86400) * 5 + rng.gauss(0, 1) for t in times]
    state = _finder_period(values, times)
    assert state["period"] == pytest.approx(86400, rel=0.01)
    assert len(state["h"]) < 512 and state["res"] >= 60 * 32


def test_noise_and_a_trend_have_no_period():
    rng = random.Random(2)
    times = [i * 300.0 for i in range(5000)]
    assert _finder_period([rng.gauss(0, 1) for _ in times], times)["period"] is None
    trend = [0.01 * i + rng.gauss(0, 1) for i in range(5000)]
    assert _finder_period(trend, times)["period"] is None


def test_a_cycle_in_records_is_found_without_event_time():
    values = _noise(3000, sd=0.3)
    values = [v + (4.0 if (i // 25) % 2 else 0.0) for i, v in enumerate(values)]  # period 50
    _, detector, live = _scores(values)
    assert detector.period_of(live, "x") == pytest.approx(50, rel=0.03)


def test_a_gap_of_days_and_a_clock_going_backwards_do_not_break_the_history():
    times = [i * 300.0 for i in range(4 * 288)]
    times += [times[-1] + 5 * 86400 + i * 300.0 for i in range(4 * 288)]  # five days silent
    times[2000], times[2001] = times[2001], times[2000]  # one reading out of order
    values = [math.sin(2 * math.pi * t / 86400) for t in times]
    state = _finder_period(values, times)
    assert state["period"] == pytest.approx(86400, rel=0.02)
    assert len(state["h"]) <= 512


# -- the detector ------------------------------------------------------------------------


def test_a_spike_is_one_alarm_and_normal_readings_are_rarely_alarms():
    values = _noise(2000)
    values[1500] = 30.0
    scores, _, _ = _scores(values)
    alarms = [i for i, s in enumerate(scores) if s >= 0.5 and i > LEARN]
    assert 1500 in alarms and not [i for i in alarms if 1500 < i < 1700]
    # Gaussian noise sets a new extreme now and then: at most one alarm in 1,700
    assert len(alarms) <= 2
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_a_level_shift_alarms_when_it_starts_then_becomes_the_new_normal():
    values = _noise(1500) + _noise(3000, seed=4, level=16.0)
    scores, _, _ = _scores(values)
    alarms = [i for i, s in enumerate(scores) if s >= 0.5 and i > 1400]
    assert alarms and 1500 <= alarms[0] <= 1510  # found at once
    assert all(i < 1500 + 3 * REST for i in alarms)  # then quiet: the new level is normal
    back = _noise(1500, seed=5) + _noise(1500, seed=6, level=16.0) + _noise(2000, seed=7)
    scores, _, _ = _scores(back)
    after = [i for i, s in enumerate(scores) if s >= 0.5 and i >= 3000]
    assert len(after) <= 3  # the return to normal is not a flood


def _rounded_noise(n: int, seed: int) -> list[float]:
    return [round(v, 3) for v in _noise(n, seed=seed)]


def test_a_frozen_sensor_alarms_once_though_its_value_is_ordinary():
    values = _rounded_noise(1500, seed=11)
    frozen = values[999]
    values[1000:1060] = [frozen] * 60
    # event-time order mixes a few good readings into the frozen run: still found
    values[1005], values[1020] = 10.2, 9.7
    scores, _, _ = _scores(values, stuck=10)
    alarms = [i for i, s in enumerate(scores) if s >= 0.5 and i > 900]
    assert len(alarms) == 1 and 1008 <= alarms[0] <= 1016
    off, _, _ = _scores(values)  # off by default: the value is ordinary, and only a
    # long run of the same error makes the likelihood wonder
    assert not [i for i, s in enumerate(off) if s >= 0.5 and 1000 <= i < 1025]


def test_a_field_that_repeats_by_nature_is_not_stuck_for_its_usual_runs():
    rng = random.Random(5)
    # a counter that often stays put for up to 15 readings: its runs are its own
    values, v = [], 0
    while len(values) < 3000:
        values += [v] * rng.randint(1, 15)
        v += 1
    scores, _, live = _scores(values[:3000], stuck=10)
    assert not [i for i, s in enumerate(scores) if s >= 0.5 and i > LEARN]
    assert live["f"]["x"]["longest"] >= 10
    # a constant field never alarms: every reading repeats the one before
    constant, _, _ = _scores([4.0] * 2000, stuck=10)
    assert max(constant) < 0.5
    # far beyond its runs, the counter is stuck
    stuck_counter, _, _ = _scores(values[:2000] + [v] * 200, stuck=10)
    assert max(stuck_counter[2000:]) >= 0.5


def test_sigma_alarms_on_a_far_value_the_range_had_already_seen():
    values = _noise(3000, seed=8)
    values[800:830] = [v - 9 for v in values[800:830]]  # an earlier fault widens the range
    values[2000:2030] = [v - 7 for v in values[2000:2030]]  # 7 sigma: inside that range
    without, _, _ = _scores(values, extreme_sigma=6)
    assert max(without[1990:2003]) < 0.5  # the runs of errors take longer
    scores, _, _ = _scores(values, extreme_sigma=6, sigma=5)
    alarms = [i for i, s in enumerate(scores) if s >= 0.5 and i > 1000]
    assert alarms and 2000 <= alarms[0] <= 2002


def test_confirm_keeps_runs_of_ordinary_errors_from_alarming():
    # Gaussian noise, no range check: what alarms is a run of errors the likelihood
    # finds unlikely, and most such runs end in an ordinary reading
    false = left = 0
    for seed in range(9, 13):
        values = _noise(30_000, seed=seed)
        noisy, _, _ = _scores(values, extreme=None)
        confirmed, _, _ = _scores(values, extreme=None, confirm=3)
        false += len([i for i, s in enumerate(noisy) if s >= 0.5 and i > LEARN])
        left += len([i for i, s in enumerate(confirmed) if s >= 0.5 and i > LEARN])
    assert false >= 4 and left <= false // 2
    # a fault of 4 sigma still alarms: its readings are out of the ordinary
    values = _noise(6000, seed=9)
    shifted = values[:5000] + [v + 4 for v in values[5000:5050]] + values[5050:]
    scores, _, _ = _scores(shifted, extreme=None, confirm=3)
    assert max(scores[5000:5050]) >= 0.5


def test_a_broken_daily_pattern_is_found_with_the_period_found_in_the_data():
    times, values = nab_series("art_daily_jumpsup.csv")
    scores, detector, live = _scores(values, times)
    assert detector.period_of(live, "x") == pytest.approx(86400, rel=0.02)
    window = (datetime(2014, 4, 10, 16, 15, tzinfo=UTC), datetime(2014, 4, 12, 1, 45, tzinfo=UTC))
    alarms = [times[i] for i, s in enumerate(scores) if s >= 0.5 and i > LEARN]
    inside = [t for t in alarms if window[0] <= t <= window[1]]
    assert inside and len(inside) >= len(alarms) - 2


def test_a_given_seasonality_is_used_and_none_turns_the_search_off():
    times = [T0 + timedelta(minutes=5 * i) for i in range(3000)]
    values = [math.sin(2 * math.pi * i / 288) for i in range(3000)]
    _, detector, live = _scores(values, times, seasonality=43200.0)
    assert detector.period_of(live, "x") == 43200.0
    _, detector, live = _scores(values, times, detect_period=False)
    assert detector.period_of(live, "x") is None


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, "12.5", True])
def test_a_value_that_is_not_a_finite_number_is_skipped_not_scored(bad):
    values = _noise(600)
    detector = LikelihoodDetector(("x", "y"))
    live = detector.load(None)
    for v in values:
        detector.step(live, {"x": v, "y": v}, None)
    score, field = detector.step(live, {"x": bad, "y": 10.0}, None)
    assert field == "y" and 0 <= score <= 1
    assert live["f"]["x"]["n"] == 600 and live["f"]["y"]["n"] == 601
    assert detector.step(live, {}, None) == (0.0, None)


def test_the_state_is_plain_json_and_a_restored_detector_scores_the_same():
    times, values = nab_series("exchange-2_cpc_results.csv")
    whole, _, _ = _scores(values, times)
    detector = LikelihoodDetector(("x",))
    blob = None
    resumed = []
    for lo in range(0, len(values), 97):  # state saved and loaded between batches
        live = detector.load(orjson.loads(blob) if blob else None)
        for v, t in zip(values[lo : lo + 97], times[lo : lo + 97], strict=True):
            resumed.append(detector.step(live, {"x": v}, t)[0])
        blob = orjson.dumps(detector.save(live))
    assert resumed == whole
    assert len(blob) < 16_000  # small keyed state: about 13 KB a field


def test_the_processor_gives_the_same_scores_however_batches_are_cut():
    records = [
        {"device": device, "ts": t, "x": v}
        for device, name in (("a", "exchange-2_cpc_results.csv"), ("b", "art_daily_jumpsup.csv"))
        for t, v in zip(*nab_series(name), strict=True)
    ]
    random.Random(8).shuffle(records)  # arrival order is not time order

    output = {"device": "string", "ts": "timestamp", "x": "double", **ADDED}
    whole = detection_harness(output).process(records)
    cut = detection_harness(output)
    pieces = []
    ordered = sorted(records, key=lambda r: r["ts"])
    for lo in range(0, len(ordered), 211):
        pieces += cut.process(ordered[lo : lo + 211])
    key = lambda r: (r["device"], r["ts"])  # noqa: E731
    assert sorted(pieces, key=key) == sorted(whole, key=key)
    for device in "ab":
        rows = [r for r in ordered if r["device"] == device]
        detector = make_detector("likelihood", ("x",), {}, None)
        t = make_threshold(0.5)
        expected = judge(
            detector, detector.load(None), t, t.empty(), rows, [r["ts"] for r in rows], 300
        )
        got = [
            (r["anomaly_score"], r["is_anomaly"], r["anomaly_field"])
            for r in sorted(whole, key=key)
            if r["device"] == device
        ]
        assert got == expected
    assert any(r["is_anomaly"] for r in whole)


def detection_harness(output: dict[str, str], **extra: object) -> KeyedProcessorTest:
    """The detect_anomalies processor with the default detector on field ``x``, keyed
    by ``device``, event time ``ts``, warm-up 300."""
    return KeyedProcessorTest(
        AnomalyDetection,
        key="device",
        event_time="ts",
        output_schema=output,
        params={
            "detector": lambda: make_detector("likelihood", ("x",), {}, None),
            "threshold": lambda: make_threshold(0.5),
            "warmup": 300,
            "only_anomalies": False,
            "event_time": "ts",
            **extra,
        },
    )


def test_unknown_parameters_fail_when_the_detector_is_made():
    with pytest.raises(TypeError, match="nope"):
        make_detector("likelihood", ("x",), {"nope": 1}, None)
