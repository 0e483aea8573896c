"""Normals fitted from history in the detect_anomalies processor, without Spark: a key
starts from its fitted normal when a version has one (no warm-up), keys without learn
online, a new version restarts them, one without the key sends it back online, a
rebaselined key learns online until the next version, a canary share of keys takes the
staging version; the ``normal`` model file is checked like any model."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from spanflow.errors import InvalidModel
from spanflow.ml.anomaly import SHADOW, AnomalyDetection
from spanflow.ml.artifacts import describe
from spanflow.ml.detectors import make_detector
from spanflow.ml.fitted import canary_key, choose
from spanflow.ml.normal import Normals, fit_normal
from spanflow.ml.thresholds import make_threshold
from spanflow.testing import KeyedProcessorTest

FIELDS = ("flow", "current")
T0 = datetime(2026, 12, 1, tzinfo=UTC)
WARMUP = 400


def _rows(device: str, start: int, n: int, flow: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "device": device,
            "ts": T0 + timedelta(seconds=i),
            "flow": flow + rng.gauss(0, 0.5),
            "current": 10 + rng.gauss(0, 0.3),
        }
        for i in range(start, start + n)
    ]


def _normals(*keys: str, flow: float = 32.0) -> Normals:
    fitted = {}
    for i, key in enumerate(keys):
        rows = [[r[f] for f in FIELDS] for r in _rows(key, 0, 500, flow, 100 + i)]
        fitted[key], _ = fit_normal(rows, FIELDS, smoothing=0.1, gain=0.8)
    return Normals(FIELDS, fitted)


def _harness(versions: dict, **extra: object) -> KeyedProcessorTest:
    generations: dict[str, int] = {}
    harness = KeyedProcessorTest(
        AnomalyDetection,
        key="device",
        event_time="ts",
        output_schema={
            "device": "string",
            "ts": "timestamp",
            **dict.fromkeys(FIELDS, "double"),
            "anomaly_score": "double",
            "is_anomaly": "boolean",
            "anomaly_field": "string?",
            **(SHADOW if extra.get("shadow") else {}),
        },
        params={
            "detector": lambda: make_detector("multivariate", FIELDS, {"warmup": WARMUP}, None),
            "threshold": lambda: make_threshold(0.5),
            "warmup": WARMUP,
            "only_anomalies": False,
            "event_time": "ts",
            "fitted": lambda: versions,  # one object, changed in place (as rebaselines)
            "rebaselines": lambda: generations,
            "canary": 0.0,
            **extra,
        },
    )
    harness.generations = generations  # type: ignore[attr-defined]
    return harness


def _flags(out: list[dict], device: str) -> list[bool]:
    return [r["is_anomaly"] for r in out if r["device"] == device]


def test_keys_start_from_their_fitted_normal_and_the_others_learn_online() -> None:
    versions: dict = {"production": None}
    harness = _harness(versions)
    fault = lambda rows: [{**r, "flow": r["flow"] - 3} for r in rows]  # noqa: E731
    harness.process(_rows("a", 0, 50, 32.0, 1) + _rows("b", 0, 50, 32.0, 2))
    versions["production"] = (1, _normals("a"))  # promoted: a has a normal, b none
    out = harness.process(fault(_rows("a", 50, 60, 32.0, 3)) + fault(_rows("b", 50, 60, 32.0, 4)))
    assert any(_flags(out, "a")[10:])  # from its fitted normal: no warm-up
    assert not any(_flags(out, "b"))  # still warming up online (110 of 400)
    # a version without a: a goes back online (a warm-up again)
    versions["production"] = (2, _normals("b"))
    out = harness.process(fault(_rows("a", 110, 60, 32.0, 5)) + fault(_rows("b", 110, 60, 32.0, 6)))
    assert not any(_flags(out, "a"))
    assert any(_flags(out, "b")[10:])


def test_a_rebaselined_key_learns_online_until_the_next_version() -> None:
    versions: dict = {"production": (1, _normals("a"))}
    harness = _harness(versions)
    low = [{**r, "flow": r["flow"] - 3} for r in _rows("a", 0, 60, 32.0, 1)]
    assert any(_flags(harness.process(low), "a"))
    harness.generations["a"] = 1  # type: ignore[attr-defined]
    assert not any(_flags(harness.process(low), "a"))  # online: warming up
    versions["production"] = (2, _normals("a"))
    assert any(_flags(harness.process(low), "a"))  # the next version: from its normal


def test_canary_keys_take_the_staging_version() -> None:
    keys = [f"pump-{i}" for i in range(1000)]
    chosen = [k for k in keys if canary_key(k, 0.1)]
    assert 60 <= len(chosen) <= 140 and chosen == [k for k in keys if canary_key(k, 0.1)]
    assert not any(canary_key(k, 0.0) for k in keys)
    production, staging = _normals("pump-1"), _normals("pump-1", flow=40.0)
    fitted = {"production": (3, production), "staging": (4, staging)}
    key = chosen[0] if "pump-1" not in chosen else "pump-1"
    assert choose(fitted, "pump-1", 1.0) == (4, staging.keys["pump-1"])
    assert choose(fitted, "pump-1", 0.0) == (3, production.keys["pump-1"])
    assert choose(fitted, "other", 1.0) == (None, None)
    assert choose({"production": None}, key, 0.5) == (None, None)


def test_a_normal_model_file_is_checked() -> None:
    data = _normals("a").to_bytes()
    assert describe(data, "normal", list(FIELDS)) == dict.fromkeys(FIELDS, "double")
    with pytest.raises(InvalidModel, match=r"not \[.current., .flow.\]"):
        describe(data, "normal", ["current", "flow"])
    for bad in (b"{", b'{"kind": "other"}', data.replace(b'"sd":[', b'"sd":[-1,')):
        with pytest.raises(InvalidModel, match="not a normal model"):
            describe(bad, "normal", list(FIELDS))


def test_a_shadow_scores_every_record_with_the_staging_version_beside_production() -> None:
    from spanflow.ml.multivariate import MultivariateDetector
    from spanflow.spec.steps.models import DetectAnomaliesStep

    production, staging = _normals("a"), _normals("a", flow=29.0)
    versions: dict = {"production": (1, production), "staging": (2, staging)}
    harness = _harness(versions, shadow=True)
    rows = _rows("a", 0, 80, 32.0, 9)
    out = harness.process(rows[:40]) + harness.process(rows[40:])  # kept across batches
    detector = MultivariateDetector(FIELDS)
    for normals, score_of in ((production, "anomaly_score"), (staging, "shadow_score")):
        live = detector.load(detector.started(normals.keys["a"]))
        assert [r[score_of] for r in out] == [detector.step(live, r, None)[0] for r in rows]
    assert {r["shadow_version"] for r in out} == {2}
    assert not any(r["is_anomaly"] for r in out) and all(r["shadow_anomaly"] for r in out[10:])
    with pytest.raises(ValueError, match="shadow scores records"):
        DetectAnomaliesStep(id="d", fields=FIELDS, shadow=True, emit="episodes")
    with pytest.raises(ValueError, match="apply to method multivariate"):
        DetectAnomaliesStep(id="d", fields=("flow",), shadow=True)
