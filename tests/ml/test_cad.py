"""The ``cad`` method (CAD OSE) without Spark: it gives the reference implementation's
scores exactly, however its state is cut between batches; it works without a declared
range; bad readings teach it nothing."""

from __future__ import annotations

import hashlib
import json
import math
import random

import orjson
import pytest

from spanflow.ml.cad import CadDetector
from spanflow.ml.detectors import make_detector
from spanflow.spec.steps.models import DetectAnomaliesStep

from .test_likelihood import NAB, nab_series

REFERENCE = json.loads((NAB / "cad_ose_reference.json").read_text())
"""Scores of numenta/NAB's own CAD OSE (nab/detectors/context_ose) on two NAB series,
run as NAB runs it: the series' minimum and maximum, rest = probationary period / 5."""


def _scores(detector: CadDetector, values: list[float], batch: int) -> list[float]:
    """Scores with the state saved as the state store keeps it every ``batch`` readings."""
    state, out = None, []
    for lo in range(0, len(values), batch):
        live = detector.load(state)
        out += [detector.step(live, {"value": v}, None)[0] for v in values[lo : lo + batch]]
        state = orjson.loads(orjson.dumps(detector.save(live)))
    return out


@pytest.mark.parametrize("name", sorted(REFERENCE["series"]))
def test_scores_are_the_reference_implementations_across_saved_state(name: str) -> None:
    expected = REFERENCE["series"][name]
    _, values = nab_series(name)
    detector = CadDetector(
        ("value",), ranges={"value": (min(values), max(values))}, rest=expected["rest"]
    )
    got = _scores(detector, values, batch=97)
    if "scores" in expected:
        pairs = enumerate(zip(got, expected["scores"], strict=True))
        mismatches = [i for i, (a, b) in pairs if a != b]
        assert not mismatches, mismatches[:10]
    assert hashlib.sha256(json.dumps(got).encode()).hexdigest() == expected["sha256"]
    assert max(got) > 0.75 and sum(s == 0 for s in got) < len(got)  # it does score


def test_without_a_range_a_new_extreme_stands_out_and_a_learnt_rhythm_does_not() -> None:
    rng = random.Random(4)
    values = [10 + 5 * math.sin(2 * math.pi * i / 50) + rng.gauss(0, 0.2) for i in range(3000)]
    values[2500] = 40.0  # far beyond anything seen
    detector = CadDetector(("value",))  # no declared range: the range seen so far
    scores = _scores(detector, values, batch=200)
    assert scores[2500] >= 0.75
    quiet = scores[1500:2500]
    assert sum(s >= 0.75 for s in quiet) <= 5  # a learnt rhythm is familiar


def test_fields_scored_alone_and_the_top_one_named() -> None:
    detector = CadDetector(("a", "b"), ranges={"a": (0, 10)})
    live = detector.load(None)
    for i in range(500):
        detector.step(live, {"a": i % 10, "b": 5.0}, None)
    score, top = detector.step(live, {"a": 3, "b": 500.0}, None)
    assert top == "b" and score >= 0.5


def test_bad_readings_are_skipped_and_parameters_checked() -> None:
    detector = CadDetector(("x",))
    live = detector.load(None)
    for i in range(100):
        detector.step(live, {"x": float(i % 7)}, None)
    before = orjson.dumps(detector.save(live))
    nan, inf = float("nan"), float("inf")
    for bad in ({}, {"x": None}, {"x": "hot"}, {"x": nan}, {"x": inf}, {"x": True}):
        assert detector.step(live, bad, None) == (0.0, None)
    assert orjson.dumps(detector.save(live)) == before  # nothing learnt
    with pytest.raises(ValueError, match="bits"):
        CadDetector(("x",), bits=0)
    with pytest.raises(ValueError, match="range of 'x'"):
        CadDetector(("x",), ranges={"x": (5, 1)})
    with pytest.raises(TypeError):
        make_detector("cad", ("x",), {"nope": 1}, None)


def test_the_step_picks_cad_when_a_fields_range_is_declared() -> None:
    step = DetectAnomaliesStep(id="d", fields=("t",), range=(-40, 125))
    assert step.method_or_default == "cad" and step.threshold_or_default == 0.75
    assert step.detector_params() == {"ranges": {"t": (-40.0, 125.0)}}
    assert DetectAnomaliesStep(id="d", fields=("t",)).method_or_default == "likelihood"
    assert DetectAnomaliesStep(id="d", fields=("t", "v")).method_or_default == "multivariate"
    both = DetectAnomaliesStep(id="d", fields=("t", "v"), method="cad", range={"t": [0, 1]})
    assert both.ranges() == {"t": (0.0, 1.0)}
    with pytest.raises(ValueError, match="range applies to method cad"):
        DetectAnomaliesStep(id="d", fields=("t", "v"), range=(0, 1))
    with pytest.raises(ValueError, match="not one of the fields"):
        DetectAnomaliesStep(id="d", fields=("t",), range={"v": (0, 1)})
    with pytest.raises(ValueError, match="low <= high"):
        DetectAnomaliesStep(id="d", fields=("t",), range=(1, 0))
    flat = DetectAnomaliesStep(id="d", fields=("t",), range=(45, 45))  # a constant series
    assert flat.detector_params() == {"ranges": {"t": (45.0, 45.0)}}


def test_state_is_plain_and_bounded_by_the_series_variety() -> None:
    _, values = nab_series("art_daily_jumpsup.csv")
    detector = CadDetector(("value",), ranges={"value": (min(values), max(values))})
    live = detector.load(None)
    for v in values:
        detector.step(live, {"value": v}, None)
    blob = orjson.dumps(detector.save(live))
    assert len(blob) < 400_000  # a few thousand contexts for a 4,032-reading series
