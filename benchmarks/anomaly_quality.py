"""Anomaly detection quality: spanflow's methods against River's HalfSpaceTrees run
directly with its documented defaults, on the same labelled series.

Series come from :mod:`spanflow.ml.synthetic`: four days of one reading a minute
(temperature with a daily cycle, vibration without), a first normal day, then four
injected anomalies of one kind (spike, level shift, drift, stuck sensor, broken daily
pattern), for several seeds. Each method sees the readings in order, scores then
learns, with the same one-day warm-up (no flag in it). Quality is the composite
F-score (anomalies found / flagged readings that are anomalous) and the delay from an
anomaly's start to its first flag, in readings (minutes).

The baseline, measured in the same run: ``river.anomaly.HalfSpaceTrees()`` with
its defaults on the raw readings, flagged above its 0.99 score quantile (the
documented example's preprocessing, a MinMaxScaler, is spanflow's ``hst`` method).

Figures are printed and written to ``benchmarks/results/anomaly_quality.json``.
Run: ``.venv/bin/python benchmarks/anomaly_quality.py [--seeds 5]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from river import anomaly

from spanflow.ml.anomaly import judge
from spanflow.ml.detectors import Detector, make_detector
from spanflow.ml.synthetic import DAY, KINDS, Series, labelled_series, quality
from spanflow.ml.thresholds import Threshold, make_threshold

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("temperature", "vibration")


class RiverDefaults(Detector):
    """River's HalfSpaceTrees exactly as documented: defaults, raw features."""

    fields = FIELDS

    def load(self, state: Any) -> Any:
        return anomaly.HalfSpaceTrees()

    def step(self, live: Any, record: Any, at: Any) -> tuple[float, str | None]:
        x = {f: record[f] for f in FIELDS}
        score = live.score_one(x)
        live.learn_one(x)
        return score, None

    def save(self, live: Any) -> Any:
        return None


METHODS: dict[str, tuple[Callable[[], Detector], Callable[[], Threshold]]] = {
    "likelihood (default)": (
        lambda: make_detector("likelihood", FIELDS, {}, None),
        lambda: make_threshold(0.5),
    ),
    "robust": (
        lambda: make_detector("robust", FIELDS, {}, 86400.0),
        lambda: make_threshold(0.5),
    ),
    "robust, adaptive threshold": (
        lambda: make_detector("robust", FIELDS, {}, 86400.0),
        lambda: make_threshold("adaptive"),
    ),
    "hst (default threshold 0.75)": (
        lambda: make_detector("hst", FIELDS, {}, None),
        lambda: make_threshold(0.75),
    ),
    "hst, quantile(0.99)": (
        lambda: make_detector("hst", FIELDS, {}, None),
        lambda: make_threshold("quantile(0.99)"),
    ),
    "river:anomaly.OneClassSVM (0.75)": (
        lambda: make_detector("river:anomaly.OneClassSVM", FIELDS, {}, None),
        lambda: make_threshold(0.75),
    ),
    "baseline: River HST defaults": (RiverDefaults, lambda: make_threshold("quantile(0.99)")),
}


def run(method: str, series: Series) -> tuple[list[bool], float]:
    make, threshold = METHODS[method]
    detector = make()
    live, limits = detector.load(None), threshold().empty()
    started = time.perf_counter()
    verdicts = judge(detector, live, threshold(), limits, series.values, series.times, DAY)
    elapsed = time.perf_counter() - started
    return [flag for _, flag, _ in verdicts], len(series.values) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    table: dict[str, dict[str, Any]] = {m: {} for m in METHODS}
    for method in METHODS:
        rates = []
        for kind in KINDS:
            results = []
            for seed in range(args.seeds):
                series = labelled_series(kind, seed)
                flags, rate = run(method, series)
                results.append(quality(series, flags))
                rates.append(rate)
            delays = [d for r in results for d in r.delays]
            table[method][kind] = {
                "precision": statistics.mean(r.precision for r in results),
                "recall": statistics.mean(r.recall for r in results),
                "f1": statistics.mean(r.f1 for r in results),
                "median_delay": statistics.median(delays) if delays else None,
            }
        table[method]["all"] = {
            "f1": statistics.mean(table[method][k]["f1"] for k in KINDS),
            "events_per_s": statistics.median(rates),
        }
    print(f"{'method':30} " + " ".join(f"{k:>14}" for k in (*KINDS, "mean F1", "events/s")))
    for method, row in table.items():
        cells = [f"{row[k]['f1']:.2f} ({_delay(row[k]['median_delay'])})" for k in KINDS]
        cells += [f"{row['all']['f1']:.2f}", f"{row['all']['events_per_s']:,.0f}"]
        print(f"{method:30} " + " ".join(f"{c:>14}" for c in cells))
    print("cells: composite F1 (median delay in readings)")
    base = table["baseline: River HST defaults"]["all"]["f1"]
    ours = table["likelihood (default)"]["all"]["f1"]
    print(f"default method / River HST defaults, mean F1: {ours:.2f} / {base:.2f}")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "anomaly_quality",
        "machine": platform.platform(),
        "seeds": args.seeds,
        "methods": table,
        "default_over_baseline_f1": ours / base if base else None,
    }
    (RESULTS / "anomaly_quality.json").write_text(json.dumps(out, indent=2) + "\n")


def _delay(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


if __name__ == "__main__":
    main()
