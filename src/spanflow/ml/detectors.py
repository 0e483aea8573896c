"""Anomaly detectors as keyed state: each scores a record, then learns from it.

A detector's state is plain data (a dict, River models as :mod:`snapshot` text), so
Spark keeps it per key in RocksDB and restores it after a crash. Methods:

* ``likelihood`` (default): :class:`~spanflow.ml.likelihood.LikelihoodDetector`;
* ``robust``: :class:`~spanflow.ml.baseline.RobustBaseline`;
* ``hst``: River's ``HalfSpaceTrees`` behind a
  :class:`~spanflow.ml.scaling.UnitScaler` (it assumes features in [0, 1]), seeded
  so that runs are reproducible;
* ``river:<module>.<Class>`` (e.g. ``river:anomaly.OneClassSVM``): any River anomaly
  detector, behind a ``StandardScaler``. Unbounded scores become [0, 1] as
  ``1 - exp(-score / mean score so far)``.

For River methods the field that contributed most is the one furthest from its own
robust baseline (River's detectors do not attribute).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from spanflow.ml import snapshot
from spanflow.ml.baseline import RobustBaseline, score_of
from spanflow.ml.detector import Detector
from spanflow.ml.likelihood import LikelihoodDetector
from spanflow.ml.river_classes import river_class
from spanflow.ml.scaling import UnitScaler

METHODS = ("likelihood", "robust", "hst", "river:<module>.<Class>")
HST_SEED = 42


class RobustDetector(Detector):
    def __init__(self, fields: tuple[str, ...], seasonality: float | None, **params: Any) -> None:
        self.fields = fields
        self.baseline = RobustBaseline(fields, seasonality=seasonality, **params)

    def load(self, state: Any) -> Any:
        return state if state is not None else self.baseline.empty()

    def step(
        self, live: Any, record: Mapping[str, Any], at: datetime | None
    ) -> tuple[float, str | None]:
        z, top = self.baseline.step(live, record, at)
        return score_of(z), top

    def save(self, live: Any) -> Any:
        return live


@dataclass
class _RiverLive:
    model: Any
    side: dict[str, Any]
    norm: dict[str, float] = field(default_factory=lambda: {"mean": 0.0, "n": 0.0})


class RiverDetector(Detector):
    """A River detector (behind a scaler) whose model is kept as a snapshot."""

    def __init__(self, fields: tuple[str, ...], method: str, **params: Any) -> None:
        self.fields = fields
        self.method = method
        self.params = params
        self.bounded = method == "hst"
        self.side = RobustBaseline(fields)
        # A bad class or parameter, or a model that cannot be kept as state, fails
        # here, when the pipeline starts
        probe = self.build()
        probe.learn_one(dict.fromkeys(fields, 0.0))
        snapshot.dump(probe)

    def build(self) -> Any:
        from river import preprocessing

        if self.method == "hst":
            from river.anomaly import HalfSpaceTrees

            params = {"seed": HST_SEED, **self.params}
            return UnitScaler() | HalfSpaceTrees(**params)
        return preprocessing.StandardScaler() | river_class(self.method)(**self.params)

    def load(self, state: Any) -> Any:
        if state is None:
            return _RiverLive(self.build(), self.side.empty())
        model = snapshot.restore(state["model"], self.build())
        return _RiverLive(model, state["side"], state["norm"])

    def step(
        self, live: Any, record: Mapping[str, Any], at: datetime | None
    ) -> tuple[float, str | None]:
        x = {f: float(record[f]) for f in self.fields if record.get(f) is not None}
        raw = float(live.model.score_one(x)) if x else 0.0
        if x:
            live.model.learn_one(x)
        _, top = self.side.step(live.side, record, None)
        if self.bounded:
            return raw, top
        return self._normalised(live.norm, raw), top

    @staticmethod
    def _normalised(norm: dict[str, float], raw: float) -> float:
        positive = max(raw, 0.0) if math.isfinite(raw) else 0.0
        mean = norm["mean"]
        score = 1.0 - math.exp(-positive / mean) if mean > 0 else 0.0
        norm["n"] += 1
        norm["mean"] = mean + (positive - mean) / min(norm["n"], 1000.0)
        return score

    def save(self, live: Any) -> Any:
        return {"model": snapshot.dump(live.model), "side": live.side, "norm": live.norm}


def make_detector(
    method: str,
    fields: tuple[str, ...],
    params: Mapping[str, Any],
    seasonality: float | None,
) -> Detector:
    """The detector a ``detect_anomalies`` step asks for (ValueError when unknown)."""
    if method == "likelihood":
        return LikelihoodDetector(fields, seasonality, **params)
    if method == "robust":
        return RobustDetector(fields, seasonality, **params)
    if method == "hst" or method.startswith("river:"):
        return RiverDetector(fields, method, **params)
    raise ValueError(f"unknown method {method!r}; methods: {', '.join(METHODS)}")
