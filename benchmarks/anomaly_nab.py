"""Anomaly detection on real data: the Numenta Anomaly Benchmark (NAB) series in
``../shared/nab`` (49 real and artificial series, 93 labelled anomaly windows),
scored by NAB's own rules with ``../shared/nab/score.py``.

Each spanflow method runs as the ``detect_anomalies`` step runs in Spark: the
step's keyed processor (:class:`spanflow.ml.anomaly.AnomalyDetection`) through
spanflow's processor harness, one key per series, its rows in timestamp order cut
into micro-batches of ``--batch`` rows (state saved and restored between batches,
as Spark's state store does). Every method uses its documented defaults, one set
for all series: no per-series settings. What NAB gives every detector — the series'
minimum and maximum — goes through the step's ``range`` option, as a plant declares
its sensors' ranges; nothing else from the future. With a declared range the step's
default over one field is ``cad``; without one, ``likelihood`` (both rows are printed,
and ``cad`` without a range). The ``anomaly_score`` of every row goes to a NAB results
file; the scorer picks one threshold per profile for the whole corpus.

Baselines, run in the same run on the same rows:

* ``rolling z-score``: mean and standard deviation of the previous 500 values,
  score ``z² / (z² + 16)`` (the baseline the NAB README quotes: 37.6);
* ``River HalfSpaceTrees``: River's documented example, ``MinMaxScaler() |
  HalfSpaceTrees(seed=42)`` with its defaults, scoring then learning each value.

Printed: NAB's standard, reward-low-FP and reward-low-FN scores of each method
(100 = perfect, 0 = the null detector) — in-sample (one threshold per profile chosen
on the whole corpus, as NAB does) and **leave-one-category-out** (for each of the six
categories with labelled windows in turn, the threshold is chosen on the others and
the held-out category is scored with it), as the mean of the six folds' scores and
pooled (every series scored with its fold's threshold, normalised once over the
corpus as NAB normalises: each series weighs as in NAB, where the mean of folds weighs
``realKnownCause``'s one series as much as a category of ten) — and the events/s of
each method's per-key code on one core (the processor with its state handling;
Spark's own overhead is in ``ml_throughput.py``). Written to
``benchmarks/results/anomaly_nab.json``.

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

# Spanflow methods as a user would write them, defaults otherwise: (method, range declared)
SPANFLOW: dict[str, tuple[str | None, bool]] = {
    "default: cad (ranges declared)": (None, True),
    "default: likelihood (no range)": (None, False),
    "cad, no range": ("cad", False),
    "robust": ("robust", False),
    "hst": ("hst", False),
}
DEFAULT = "default: cad (ranges declared)"
BASELINES = ("rolling z-score", "River HalfSpaceTrees")


def read_series(path: Path) -> tuple[list[datetime], list[float]]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    times = [datetime.fromisoformat(r["timestamp"]).replace(tzinfo=UTC) for r in rows]
    return times, [float(r["value"]) for r in rows]


def run_processor(
    method: tuple[str | None, bool], times: list[datetime], values: list[float], batch: int
) -> list[float]:
    """The detect_anomalies step's keyed processor over one series, batch by batch;
    with the series' minimum and maximum as its declared range when asked (NAB's)."""
    from anomaly_step import step_harness

    from spanflow.spec.steps.models import DetectAnomaliesStep

    name, declared = method
    bounds = (min(values), max(values)) if declared else None
    step = DetectAnomaliesStep(id="detect", fields=("value",), method=name, range=bounds)
    harness = step_harness(
        step, "series", {"series": "string", "ts": "timestamp", "value": "double"}
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


def score(
    nab: Path, results: Path, windows: Path | None = None, threshold: str | None = None
) -> dict[str, Any]:
    """NAB's three profiles for one results tree, by NAB's scorer: over the series of
    ``windows`` (default: all), with one threshold per profile optimised over them, or
    the ``threshold`` given (``profile=value,...``)."""
    fixed = ["--threshold", threshold] if threshold else []
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sys.executable, str(nab / "score.py"), "score", "--results", str(results),
             "--data", str(nab / "data"), "--windows", str(windows or nab / "windows.json"),
             "--json", out.name, *fixed],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        report = json.loads(Path(out.name).read_text())
    keep = ("score", "threshold", "tp", "fp", "fn", "raw", "null_raw", "perfect")
    return {p: {k: report[p][k] for k in keep} for p in PROFILES}


def fold_categories(windows: dict[str, list[Any]]) -> list[str]:
    """The categories a fold holds out: those with at least one labelled window."""
    return sorted({name.split("/")[0] for name, spans in windows.items() if spans})


def score_held_out(nab: Path, results: Path, windows: dict[str, list[Any]]) -> dict[str, Any]:
    """Leave-one-category-out: per fold, thresholds chosen on the other categories'
    series, the held-out category scored with them; per profile, the mean of the
    folds' scores and the pooled score (raw scores summed over the folds, normalised
    once: null detector 0, perfect 100)."""
    folds: dict[str, dict[str, float]] = {}
    sums = {p: [0.0, 0.0, 0.0] for p in PROFILES}  # raw, null, perfect
    with tempfile.TemporaryDirectory() as tmp:
        for category in fold_categories(windows):
            tune = {k: v for k, v in windows.items() if not k.startswith(f"{category}/")}
            held = {k: v for k, v in windows.items() if k.startswith(f"{category}/")}
            tune_file, held_file = Path(tmp) / "tune.json", Path(tmp) / "held.json"
            tune_file.write_text(json.dumps(tune))
            held_file.write_text(json.dumps(held))
            chosen = score(nab, results, tune_file)
            fixed = ",".join(f"{p}={chosen[p]['threshold']}" for p in PROFILES)
            scored = score(nab, results, held_file, threshold=fixed)
            folds[category] = {p: scored[p]["score"] for p in PROFILES}
            for p in PROFILES:
                for i, part in enumerate(("raw", "null_raw", "perfect")):
                    sums[p][i] += scored[p][part]
    mean = {p: sum(f[p] for f in folds.values()) / len(folds) for p in PROFILES}
    pooled = {p: 100.0 * (raw - null) / (best - null) for p, (raw, null, best) in sums.items()}
    return {"mean": mean, "pooled": pooled, "folds": folds}


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
            table[m]["held_out"] = score_held_out(args.nab, root / _slug(m), windows)
    for m in methods:
        table[m]["events_per_s"] = timing[m][1] / timing[m][0]
    print_table(table, len(windows))
    if args.only:
        return  # a partial run prints; the results file holds full runs only
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "anomaly_nab",
        "machine": platform.platform(),
        "series": len(windows),
        "windows": sum(len(w) for w in windows.values()),
        "batch_rows": args.batch,
        "default": DEFAULT,
        "methods": table,
        "default_over_zscore_standard": table[DEFAULT]["standard"]["score"]
        / table["rolling z-score"]["standard"]["score"],
    }
    (RESULTS / "anomaly_nab.json").write_text(json.dumps(out, indent=2) + "\n")


def print_table(table: dict[str, Any], series: int) -> None:
    print(f"NAB, {series} series; scores: 100 perfect, 0 the null detector")
    print("in-sample: thresholds chosen on every series; held out: leave one category out")
    head = f"{'method':32} {'standard':>8} {'low FP':>7} {'low FN':>7}"
    print(f"{head}  {'held-out: mean of folds':>23}  {'pooled':>6} {'events/s':>9}")
    for m, row in table.items():
        cells = " ".join(f"{row[p]['score']:7.1f}" for p in PROFILES)
        held = row["held_out"]
        folds = " ".join(f"{held['mean'][p]:7.1f}" for p in PROFILES)
        print(f"{m:32}  {cells}  {folds}  {held['pooled'][PROFILES[0]]:6.1f} "
              f"{row['events_per_s']:9,.0f}")  # fmt: skip
    print("held-out standard score per category:")
    for m, row in table.items():
        folds = row["held_out"]["folds"]
        print(f"  {m:30} " + "  ".join(f"{c} {f[PROFILES[0]]:.1f}" for c, f in folds.items()))


def _slug(method: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in method).strip("_")


if __name__ == "__main__":
    main()
