"""Anomaly episodes: one row when an episode starts, one when it ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import spanflow as sf
from spanflow.errors import SpecError
from spanflow.ml.anomaly import judge
from spanflow.ml.detectors import make_detector
from spanflow.ml.episodes import EPISODE_FIELDS, Episodes
from spanflow.ml.thresholds import make_threshold
from tests.ml.test_likelihood import _noise, detection_harness

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _run(tracker: Episodes, flags: list[bool], minutes: list[int] | None = None) -> list[dict]:
    state = tracker.empty()
    rows = []
    for i, flag in enumerate(flags):
        at = T0 + timedelta(minutes=minutes[i] if minutes else i)
        rows += tracker.step(state, at, 0.5 + i / 100 if flag else 0.1, flag, f"f{i}")
    return rows


def test_an_episode_is_a_start_and_an_end_with_its_peak_and_counts():
    flags = [False] * 3 + [True, False, True, True] + [False] * 5 + [True] + [False] * 5
    rows = _run(Episodes(quiet_readings=4), flags)
    assert [r["episode"] for r in rows] == ["start", "end", "start", "end"]
    first_start, first_end = rows[0], rows[1]
    assert first_start["episode_start"] == T0 + timedelta(minutes=3)
    assert first_start["episode_end"] is None and first_start["anomalies"] == 1
    assert first_end["episode_end"] == T0 + timedelta(minutes=6)
    assert (first_end["anomalies"], first_end["readings"]) == (3, 4)
    assert (first_end["peak_score"], first_end["anomaly_field"]) == (0.56, "f6")
    assert set(rows[0]) == set(EPISODE_FIELDS)


def test_a_quiet_period_in_event_time_ignores_how_many_readings_came():
    flags = [True, False, False, False, True, False]
    minutes = [0, 1, 2, 3, 20, 40]  # a gap of 17 minutes, then of 20
    rows = _run(Episodes(quiet_seconds=600), flags, minutes)
    assert [(r["episode"], r["anomalies"]) for r in rows] == [
        ("start", 1),
        ("end", 1),
        ("start", 1),
        ("end", 1),
    ]


def test_an_ongoing_episode_is_one_alarm_not_a_flood():
    values = _noise(1500) + _noise(400, seed=9, level=30.0) + _noise(600, seed=10)
    records = [{"x": v} for v in values]
    detector = make_detector("likelihood", ("x",), {}, None)
    t = make_threshold(0.5)
    verdicts = judge(detector, detector.load(None), t, t.empty(), records, None, 300)
    tracker, state, rows = Episodes(), Episodes().empty(), []
    for score, flag, field in verdicts:
        rows += tracker.step(state, None, score, flag, field)
    starts = [r for r in rows if r["episode"] == "start"]
    assert 1 <= len(starts) <= 3  # the shift, at most its end, and perhaps a noise extreme
    assert sum(flag for _, flag, _ in verdicts) >= len(starts)


def test_the_processor_emits_episodes_with_the_key_and_event_time():
    values = _noise(800)
    values[500], values[650] = 40.0, 60.0  # the second spike is higher: a new extreme
    records = [
        {"device": "a", "ts": T0 + timedelta(minutes=i), "x": v} for i, v in enumerate(values)
    ]
    harness = detection_harness(
        {"device": "string", "ts": "timestamp", **EPISODE_FIELDS},
        episodes=lambda: Episodes(quiet_readings=50),
    )
    rows = []
    for lo in range(0, len(records), 77):
        rows += harness.process(records[lo : lo + 77])
    assert [(r["episode"], r["ts"]) for r in rows] == [
        ("start", records[500]["ts"]),
        ("end", records[550]["ts"]),
        ("start", records[650]["ts"]),
        ("end", records[700]["ts"]),
    ]
    assert all(r["device"] == "a" and r["anomaly_field"] == "x" for r in rows)


def test_quiet_needs_episodes_and_a_time_quiet_needs_event_time():
    s = sf.Pipeline("bad").source("S", schema={"device": "string", "t": "double"}, key="device")
    with pytest.raises(SpecError, match="quiet applies to emit: episodes"):
        s.detect_anomalies("t", quiet=10)
    with pytest.raises(SpecError, match="quiet is a number of readings"):
        s.detect_anomalies("t", emit="episodes", quiet=0)
    with pytest.raises(SpecError, match="no event time"):
        s.detect_anomalies("t", emit="episodes", quiet="10m").sink_console().spec()


def test_a_rebaselined_key_ends_its_episode_and_learns_its_new_level_afresh():
    shifted = _noise(1200)
    for i in range(500, 1200):
        shifted[i] += 40.0  # a fault that stays
    records = [
        {"device": d, "ts": T0 + timedelta(minutes=i), "x": v}
        for i, v in enumerate(shifted)
        for d in ("a", "b")
    ]
    generations: dict[str, int] = {}
    harness = detection_harness(
        {"device": "string", "ts": "timestamp", **EPISODE_FIELDS},
        episodes=lambda: Episodes(quiet_readings=50),
        rebaselines=lambda: generations,
        # holds a fault as a state (the default method adapts to a level in ~50 readings)
        detector=lambda: make_detector("multivariate", ("x",), {"warmup": 300}, None),
    )
    before = harness.process(records[:1200])  # readings 0-599 of both keys
    onset = T0 + timedelta(minutes=506)  # the chart over its limit from 502, 5 of 10 over
    assert [(r["device"], r["episode"], r["ts"]) for r in before] == [
        ("a", "start", onset),
        ("b", "start", onset),
    ]
    generations["a"] = 1  # the operator accepts a's new level
    after = harness.process(records[1200:])
    a_rows = [(r["episode"], r["ts"]) for r in after if r["device"] == "a"]
    assert a_rows == [("end", T0 + timedelta(minutes=600))]  # then nothing: the level is normal
    assert harness.state("detector", "a") is not None
    assert all(r["ts"] != T0 + timedelta(minutes=600) for r in after if r["device"] == "b")
