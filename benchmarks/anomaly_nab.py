"""Anomaly detection on real data: the Numenta Anomaly Benchmark (NAB) series in
``../shared/nab`` (49 real and artificial series, 93 labelled anomaly windows),
scored by NAB's own rules with ``../shared/nab/score.py``.

Each spanflow method runs as the ``detect_anomalies`` step runs in Spark: the
step's keyed processor (:class:`spanflow.ml.anomaly.AnomalyDetection`) through
spanflow's processor harness, one key per series, its rows in timestamp order cut
into micro-batches of ``--batch`` rows (state saved and restored between batches,
as Spark's state store does). Every method uses its documented defaults, one set
for all series: no per-series settings. The ``anomaly_score`` of every row goes to a
NAB results file; the scorer picks one threshold per profile for the whole corpus.

Baselines, run in the same run on the same rows:

* ``rolling z-score``: mean and standard deviation of the previous 500 values,
  score ``z² / (z² + 16)`` (the baseline the NAB README quotes: 37.6);
* ``River HalfSpaceTrees``: River's documented example, ``MinMaxScaler() |
  HalfSpaceTrees(seed=42)`` with its defaults, scoring then learning each value.

Printed: NAB's standard, reward-low-FP and reward-low-FN scores of each method
(100 = perfect, 0 = the null detector), and the events/s of each method's per-key
code on one core (the processor with its state handling; Spark's own overhead is in
``ml_throughput.py``). Written to ``benchmarks/results/anomaly_nab.json``.

Run: ``.venv/bin/python benchmarks/anomaly_nab.py [--nab ../shared/nab] [--batch 200]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_NAB = Path(__file__).resolve().parents[2] / "shared" / "nab"
PROFILES = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")

# Spanflow methods: (method, threshold) as a user would write them, defaults otherwise
SPANFLOW = {
    "likelihood (default)": "likelihood",
    "robust": "robust",
    "hst": "hst",
}
BASELINES = ("rolling z-score", "River HalfSpaceTrees")


def read_series(path: Path) -> tuple[list[datetime], list[float]]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    times = [datetime.fromisoformat(r["timestamp"]).replace(tzinfo=UTC) for r in rows]
    return times, [float(r["value"]) for r in rows]


def run_processor(
    method: str, times: list[datetime], values: list[float], batch: int
) -> list[float]:
    """The detect_anomalies step's keyed processor over one series, batch by batch."""
    from spanflow.ml.anomaly import AnomalyDetection
    from spanflow.ml.detectors import make_detector
    from spanflow.ml.thresholds import make_threshold
    from spanflow.spec.steps.models import DetectAnomaliesStep
    from spanflow.testing import KeyedProcessorTest

    step = DetectAnomaliesStep(id="detect", fields=("value",), method=method)
    season = step.season_seconds(has_event_time=True)
    harness = KeyedProcessorTest(
        AnomalyDetection,
        key="series",
        event_time="ts",
        output_schema={
            "series": "string",
            "ts": "timestamp",
            "value": "double",
            "anomaly_score": "double",
            "is_anomaly": "boolean",
            "anomaly_field": "string?",
        },
        params={
            "detector": lambda: make_detector(
                step.method, step.fields, step.detector_params(), season
            ),
            "threshold": lambda: make_threshold(step.threshold_or_default),
            "warmup": step.warmup_or_default,
            "only_anomalies": False,
            "event_time": "ts",
        },
    )
    scores: list[float] = []
    for lo in range(0, len(values), batch):
        rows = [
            {"series": "s", "ts": t, "value": v}
            for t, v in zip(times[lo : lo + batch], values[lo : lo + batch], strict=True)
        ]
        scores += [r["anomaly_score"] for r in harness.process(rows)]
    return scores


def rolling_z(values: list[float], window: int = 500) -> list[float]:
    """z²/(z²+16) against the mean and deviation of the previous ``window`` values."""
    out, total, squares = [], 0.0, 0.0
    for i, v in enumerate(values):
        n = min(i, window)
        if n > 1:
            mean = total / n
            sd = math.sqrt(max(squares / n - mean * mean, 0.0))
            z = (v - mean) / sd if sd > 0 else 0.0
            out.append(z * z / (z * z + 16))
        else:
            out.append(0.0)
        total += v
        squares += v * v
        if i >= window:
            total -= values[i - window]
            squares -= values[i - window] ** 2
    return out


def river_hst(values: list[float]) -> list[float]:
    """River's documented HalfSpaceTrees example, defaults throughout."""
    from river import anomaly, preprocessing

    model = preprocessing.MinMaxScaler() | anomaly.HalfSpaceTrees(seed=42)
    out = []
    for v in values:
        x = {"value": v}
        out.append(float(model.score_one(x)))
        model.learn_one(x)
    return out


def run_one(args: tuple[str, str, str, str, int]) -> tuple[str, str, float, int]:
    """Run one method on one series, write its NAB results file; (method, series,
    seconds, rows)."""
    name, method_key, data_file, out_file, batch = args
    times, values = read_series(Path(data_file))
    runner: Callable[[], list[float]]
    if method_key == "rolling z-score":
        runner = lambda: rolling_z(values)  # noqa: E731
    elif method_key == "River HalfSpaceTrees":
        runner = lambda: river_hst(values)  # noqa: E731
    else:
        runner = lambda: run_processor(SPANFLOW[method_key], times, values, batch)  # noqa: E731
    started = time.perf_counter()
    scores = runner()
    elapsed = time.perf_counter() - started
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    with open(data_file) as f:
        stamps = [r["timestamp"] for r in csv.DictReader(f)]
    with open(out_file, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "anomaly_score"])
        for stamp, score in zip(stamps, scores, strict=True):
            w.writerow([stamp, min(1.0, max(0.0, score))])
    return method_key, name, elapsed, len(values)


def score(nab: Path, results: Path) -> dict[str, Any]:
    """NAB's three profiles for one results tree, by NAB's scorer."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sys.executable, str(nab / "score.py"), "score", "--results", str(results),
             "--data", str(nab / "data"), "--windows", str(nab / "windows.json"),
             "--json", out.name],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        report = json.loads(Path(out.name).read_text())
    return {
        p: {k: report[p][k] for k in ("score", "threshold", "tp", "fp", "fn")} for p in PROFILES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nab", type=Path, default=DEFAULT_NAB, help="the NAB folder")
    parser.add_argument("--batch", type=int, default=200, help="rows per micro-batch")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--keep", type=Path, help="keep the NAB results files here")
    parser.add_argument(
        "--only", action="append", metavar="METHOD", help="run just this method (repeatable)"
    )
    args = parser.parse_args()
    windows = json.loads((args.nab / "windows.json").read_text())
    methods = [m for m in (*SPANFLOW, *BASELINES) if not args.only or m in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        jobs = [
            (rel, m, str(args.nab / "data" / rel), str(root / _slug(m) / rel), args.batch)
            for m in methods
            for rel in sorted(windows)
        ]
        timing: dict[str, list[float]] = {m: [0.0, 0.0] for m in methods}
        started = time.monotonic()
        with ProcessPoolExecutor(args.workers) as pool:
            for done, (method, _, seconds, rows) in enumerate(pool.map(run_one, jobs), 1):
                timing[method][0] += seconds
                timing[method][1] += rows
                if sys.stdout.isatty() or done % 49 == 0:
                    print(f"\r{done}/{len(jobs)} series runs ({time.monotonic() - started:.0f} s)",
                          end="" if sys.stdout.isatty() else "\n", flush=True)  # fmt: skip
        print()
        table = {m: score(args.nab, root / _slug(m)) for m in methods}
    for m in methods:
        table[m]["events_per_s"] = timing[m][1] / timing[m][0]
    print(f"NAB, {len(windows)} series; scores: 100 perfect, 0 the null detector")
    print(f"{'method':24} {'standard':>9} {'low FP':>9} {'low FN':>9} {'events/s':>10}")
    for m in methods:
        row = table[m]
        cells = [f"{row[p]['score']:9.1f}" for p in PROFILES]
        print(f"{m:24} {' '.join(cells)} {row['events_per_s']:10,.0f}")
    if args.only:
        return  # a partial run prints; the results file holds full runs only
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "anomaly_nab",
        "machine": platform.platform(),
        "series": len(windows),
        "windows": sum(len(w) for w in windows.values()),
        "batch_rows": args.batch,
        "methods": table,
        "default_over_zscore_standard": table["likelihood (default)"]["standard"]["score"]
        / table["rolling z-score"]["standard"]["score"],
    }
    (RESULTS / "anomaly_nab.json").write_text(json.dumps(out, indent=2) + "\n")


def _slug(method: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in method).strip("_")


if __name__ == "__main__":
    main()
