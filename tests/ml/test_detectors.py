"""Anomaly detectors, thresholds and the keyed processor, without Spark."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from river import anomaly, preprocessing

import spanflow as sf
from spanflow.errors import SpecError
from spanflow.ml.anomaly import AnomalyDetection, judge
from spanflow.ml.calibration import TailCalibration
from spanflow.ml.detectors import make_detector
from spanflow.ml.scaling import UnitScaler
from spanflow.ml.synthetic import DAY, KINDS, labelled_series, quality
from spanflow.ml.thresholds import make_threshold
from spanflow.spec.steps.models import parse_threshold
from spanflow.testing import KeyedProcessorTest

FIELDS = ("temperature", "vibration")
T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _readings(n: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        spike = 8.0 if i % 97 == 50 else 0.0
        out.append(
            {
                "device": "a" if i % 3 else "b",
                "ts": T0 + timedelta(minutes=i),
                "temperature": 20 + rng.gauss(0, 0.5) + spike,
                "vibration": 0.5 + rng.gauss(0, 0.05),
            }
        )
    return out


def _run(method: str, records: list[dict], threshold="quantile(0.99)", season=None):
    detector = make_detector(method, FIELDS, {}, season)
    live, t = detector.load(None), make_threshold(threshold)
    return judge(detector, live, t, t.empty(), records, [r["ts"] for r in records], 0)


def test_hst_scores_are_rivers_own_run_over_values_and_changes_calibrated():
    records = _readings(1000)
    ours = [score for score, _, _ in _run("hst", records)]
    model = UnitScaler() | anomaly.HalfSpaceTrees(seed=42)
    calibration = TailCalibration()
    tail = calibration.empty()
    theirs, last = [], {}
    for r in records:
        x = {f: r[f] for f in FIELDS}
        x |= {f"{f}~d": r[f] - last.get(f, r[f]) for f in FIELDS}
        last = {f: r[f] for f in FIELDS}
        theirs.append(calibration.step(tail, model.score_one(x)))
        model.learn_one(x)
    assert ours == theirs
    # Once the trees hold two windows (250 readings each) of reference mass, every
    # spike (each 97th reading from the 50th) is rarer than one in 100, and the
    # other readings are so in about one case in 100
    later = range(500, len(records))
    assert all(ours[i] >= 0.5 for i in later if i % 97 == 50)
    assert sum(ours[i] >= 0.5 for i in later if i % 97 != 50) <= 10


def test_a_river_detector_scores_equal_rivers_raw_scores_normalised_and_calibrated():
    records = _readings(300)
    ours = [score for score, _, _ in _run("river:anomaly.OneClassSVM", records)]
    model = preprocessing.StandardScaler() | anomaly.OneClassSVM()
    calibration = TailCalibration()
    tail = calibration.empty()
    expected, mean = [], 0.0
    for n, r in enumerate(records, start=1):
        x = {f: r[f] for f in FIELDS}
        raw = max(model.score_one(x), 0.0)
        model.learn_one(x)
        normalised = 1 - math.exp(-raw / mean) if mean > 0 else 0.0
        expected.append(calibration.step(tail, normalised))
        mean += (raw - mean) / min(n, 1000)
    assert ours == expected


def test_the_calibrated_score_is_how_rare_a_raw_score_is_among_recent_ones():
    rng = random.Random(3)
    calibration = TailCalibration()
    tail = calibration.empty()
    scores = [calibration.step(tail, rng.random() * 0.9) for _ in range(20_000)]
    # One in 100 raw scores is in the top 1 %: a calibrated score of 0.5 or more
    share = sum(s >= 0.5 for s in scores[2000:]) / len(scores[2000:])
    assert 0.007 < share < 0.013
    # A raw score above every one seen is as rare as the memory (≈ 10,000 scores) tells
    assert calibration.step(tail, 0.95) > 0.98
    # Scores crowded near 1 (as Half-Space Trees give) are told apart as well
    crowded = TailCalibration()
    state = crowded.empty()
    for _ in range(5000):
        crowded.step(state, 0.97 + rng.random() * 0.02)
    assert crowded.step(state, 0.995) > 0.85 > 0.15 > crowded.step(state, 0.98)


@pytest.mark.parametrize("kind", KINDS)
def test_the_robust_method_finds_every_kind_of_anomaly(kind):
    for seed in (0, 1):
        series = labelled_series(kind, seed)
        detector = make_detector("robust", FIELDS, {}, 86400.0)
        t = make_threshold(0.5)
        verdicts = judge(
            detector, detector.load(None), t, t.empty(), series.values, series.times, DAY
        )
        q = quality(series, [flag for _, flag, _ in verdicts])
        assert q.recall >= 0.75 and q.f1 >= 0.5, (kind, seed, q)


def test_the_field_that_contributed_most_is_named():
    records = _readings(200)
    verdicts = _run("robust", records, threshold=0.5)
    flagged = [(i, field) for i, (_, flag, field) in enumerate(verdicts) if flag]
    assert flagged and all(i % 97 == 50 and field == "temperature" for i, field in flagged)


def test_warmup_scores_but_never_flags():
    records = _readings(300)  # spikes at 50, 147 and 244
    detector = make_detector("robust", FIELDS, {}, None)
    t = make_threshold(0.5)
    verdicts = judge(detector, detector.load(None), t, t.empty(), records, None, 150)
    assert verdicts[147][0] > 0.5 and not verdicts[147][1]  # a spike during warm-up
    assert not any(flag for _, flag, _ in verdicts[:150])
    assert [i for i, (_, flag, _) in enumerate(verdicts) if flag] == [244]


def test_thresholds_static_quantile_and_adaptive():
    assert parse_threshold(0.7) == ("static", 0.7)
    assert parse_threshold("adaptive") == ("adaptive", 3.0)
    assert parse_threshold("quantile(0.95)") == ("quantile", 0.95)
    for bad in ("quantile(1.5)", "adaptive(0)", "sometimes", 1.5, True):
        with pytest.raises(ValueError):
            parse_threshold(bad)
    rng = random.Random(2)
    noise = [rng.random() * 0.3 for _ in range(3000)]
    for threshold in ("quantile(0.999)", "adaptive(4)", 0.6):
        t = make_threshold(threshold)
        state = t.empty()
        flags = [t.step(state, s) for s in noise]
        assert sum(flags[1000:]) <= 10, threshold  # the bar settles above the noise
        assert t.step(state, 0.95), threshold  # and an outlier clears it


def _processor_test() -> KeyedProcessorTest:
    detector = lambda: make_detector("robust", FIELDS, {}, 86400.0)  # noqa: E731
    return KeyedProcessorTest(
        AnomalyDetection,
        key="device",
        event_time="ts",
        output_schema={
            "device": "string",
            "ts": "timestamp",
            "temperature": "double",
            "vibration": "double",
            "anomaly_score": "double",
            "is_anomaly": "boolean",
            "anomaly_field": "string?",
        },
        params={
            "detector": detector,
            "threshold": lambda: make_threshold(0.5),
            "warmup": 20,
            "only_anomalies": False,
            "event_time": "ts",
        },
    )


def test_the_processor_gives_the_same_scores_however_batches_are_cut():
    records = _readings(400)
    whole = _processor_test().process(records)
    cut = _processor_test()
    pieces = []
    for lo in range(0, len(records), 37):
        pieces += cut.process(records[lo : lo + 37])
    key = lambda r: (r["device"], r["ts"])  # noqa: E731
    assert sorted(pieces, key=key) == sorted(whole, key=key)
    by_device = {}
    for r in records:
        by_device.setdefault(r["device"], []).append(r)
    for device, rows in by_device.items():
        detector = make_detector("robust", FIELDS, {}, 86400.0)
        t = make_threshold(0.5)
        expected = judge(
            detector, detector.load(None), t, t.empty(), rows, [r["ts"] for r in rows], 20
        )
        got = [
            (r["anomaly_score"], r["is_anomaly"], r["anomaly_field"])
            for r in sorted(whole, key=key)
            if r["device"] == device
        ]
        assert got == expected


def test_pipeline_errors_are_clear():
    p = sf.Pipeline("bad")
    s = p.source("S", schema={"device": "string", "t": "double"}, key="device")
    with pytest.raises(SpecError, match="unknown threshold 'often'"):
        s.detect_anomalies("t", threshold="often")
    with pytest.raises(SpecError, match="method"):
        s.detect_anomalies("t", method="magic")
    with pytest.raises(SpecError, match="seasonality applies to the likelihood and robust"):
        s.detect_anomalies("t", method="hst", seasonality="1d")
    with pytest.raises(SpecError, match="fields this step adds"):
        s.detect_anomalies("anomaly_score")
    with pytest.raises(SpecError, match="no event time"):
        s.detect_anomalies("t", seasonality="1d").sink_console().spec()
    with pytest.raises(ValueError, match=r"River has no anomaly\.Nope"):
        make_detector("river:anomaly.Nope", ("t",), {}, None)
