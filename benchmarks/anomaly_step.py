"""The ``detect_anomalies`` step's keyed processor in spanflow's processor harness, as
the anomaly benchmarks run it (``anomaly_nab.py``, ``anomaly_skab.py``): built from
the step's spec exactly as the Spark compiler builds it, one key, event time ``ts``."""

from __future__ import annotations

from typing import Any


def step_harness(
    step: Any, key: str, schema: dict[str, str], model: dict[str, Any] | None = None
) -> Any:
    """A :class:`spanflow.testing.KeyedProcessorTest` of ``step`` over rows of
    ``schema`` (without the fields the step adds) keyed by ``key``; ``model``: a fitted
    multivariate normal (:meth:`spanflow.ml.normal.Normal.plain`) every key starts from."""
    from spanflow.ml.anomaly import ADDED, AnomalyDetection
    from spanflow.ml.detectors import make_detector
    from spanflow.ml.normal import Normal
    from spanflow.ml.thresholds import make_threshold
    from spanflow.testing import KeyedProcessorTest

    season = step.season_seconds(has_event_time=True)
    params = step.detector_params()
    if model is not None:
        params = {**params, "model": Normal.from_plain(model)}
    return KeyedProcessorTest(
        AnomalyDetection,
        key=key,
        event_time="ts",
        output_schema={**schema, **ADDED},
        params={
            "detector": lambda: make_detector(step.method_or_default, step.fields, params, season),
            "threshold": lambda: make_threshold(step.threshold_or_default),
            "warmup": step.warmup_or_default,
            "only_anomalies": False,
            "event_time": "ts",
        },
    )
