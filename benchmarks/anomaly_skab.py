"""Anomaly detection on a real industrial pump: the SKAB experiments in
``../shared/skab`` (a water-circulation testbed, 8 sensors at 1 Hz; in each experiment
about 400 normal rows, then a fault induced and later undone), scored by SKAB's own
rules with ``../shared/skab/score.py``: per-row F1, false alarm rate (FAR) and missed
alarm rate (MAR) after each experiment's 400 training rows, plus events (faults found,
false alarm episodes).

Each spanflow method runs as the ``detect_anomalies`` step runs in Spark: the step's
keyed processor through spanflow's processor harness, one key per experiment, all 8
fields, rows in time order cut into micro-batches of ``--batch`` rows (state saved and
restored between batches, as Spark's state store does). Every method uses its
documented defaults but ``warmup: 400`` — the experiments' training part, which a
user of this testbed would set; its ``is_anomaly`` flags are what is scored.

Baseline from the same run: Hotelling's T-squared fitted on each experiment's first
400 rows, flagged above the 99th percentile of its training values (computed by
``score.py`` from the data alone).

Printed: F1, FAR, MAR, faults found and false alarm episodes per method beside the
baseline, and events/s of each method's per-key code. Written to
``benchmarks/results/anomaly_skab.json``.

Run: ``.venv/bin/python benchmarks/anomaly_skab.py [--skab ../shared/skab] [--batch 200]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_SKAB = Path(__file__).resolve().parents[2] / "shared" / "skab"
FIELDS = (
    "Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature",
    "Thermocouple", "Voltage", "Volume Flow RateRMS",
)  # fmt: skip
WARMUP = 400
SPANFLOW = {
    "likelihood (default)": "likelihood",
    "multivariate": "multivariate",
    "robust": "robust",
    "hst": "hst",
}


def read_experiment(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter=";"))
    return [
        {
            "ts": datetime.fromisoformat(r["datetime"]).replace(tzinfo=UTC),
            **{name: float(r[name]) for name in FIELDS},
        }
        for r in rows
    ]


def run_processor(method: str, rows: list[dict[str, Any]], batch: int) -> list[tuple[float, bool]]:
    """The detect_anomalies step's keyed processor over one experiment."""
    from anomaly_step import step_harness

    from spanflow.spec.steps.models import DetectAnomaliesStep

    step = DetectAnomaliesStep(id="detect", fields=FIELDS, method=method, warmup=WARMUP)
    schema = {"run": "string", "ts": "timestamp", **dict.fromkeys(FIELDS, "double")}
    harness = step_harness(step, "run", schema)
    out: list[tuple[float, bool]] = []
    for lo in range(0, len(rows), batch):
        chunk = [{"run": "r", **row} for row in rows[lo : lo + batch]]
        out += [(r["anomaly_score"], bool(r["is_anomaly"])) for r in harness.process(chunk)]
    return out


def run_one(args: tuple[str, str, str, int]) -> tuple[str, float, int]:
    """One method on one experiment: its results file; (method, seconds, rows)."""
    method, data_file, out_file, batch = args
    rows = read_experiment(Path(data_file))
    run_processor(SPANFLOW[method], rows[:50], batch)  # imports and first calls: not timed
    started = time.perf_counter()
    verdicts = run_processor(SPANFLOW[method], rows, batch)
    elapsed = time.perf_counter() - started
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    with open(out_file, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["datetime", "is_anomaly", "anomaly_score"])
        for row, (score, flag) in zip(rows, verdicts, strict=True):
            w.writerow([row["ts"].isoformat(), int(flag), min(1.0, max(0.0, score))])
    return method, elapsed, len(rows)


def score(skab: Path, results: Path) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sys.executable, str(skab / "score.py"), "--data", str(skab / "data"),
             "--results", str(results), "--json", out.name],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        return dict(json.loads(Path(out.name).read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skab", type=Path, default=DEFAULT_SKAB, help="the SKAB folder")
    parser.add_argument("--batch", type=int, default=200, help="rows per micro-batch")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--only", action="append", metavar="METHOD", help="run just this method (repeatable)"
    )
    args = parser.parse_args()
    experiments = sorted((args.skab / "data").glob("*/*.csv"))
    methods = [m for m in SPANFLOW if not args.only or m in args.only]
    timing = {m: [0.0, 0] for m in methods}
    table: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        jobs = [
            (m, str(p), str(root / _slug(m) / p.relative_to(args.skab / "data")), args.batch)
            for m in methods
            for p in experiments
        ]
        started = time.monotonic()
        with ProcessPoolExecutor(args.workers) as pool:
            for done, (method, seconds, rows) in enumerate(pool.map(run_one, jobs), 1):
                timing[method][0] += seconds
                timing[method][1] += rows
                print(f"\r{done}/{len(jobs)} experiment runs ({time.monotonic() - started:.0f} s)",
                      end="" if sys.stdout.isatty() else "\n", flush=True)  # fmt: skip
        print()
        for m in methods:
            report = score(args.skab, root / _slug(m))
            table[m] = {**report["detector"], "events_per_s": timing[m][1] / timing[m][0]}
            baseline = report["t_squared_baseline"]
    runs = len(experiments)
    print(f"SKAB, {runs} experiments, 8 sensors; scored after each one's {WARMUP} training rows")
    print(f"{'method':24} {'F1':>6} {'FAR %':>7} {'MAR %':>7} {'faults':>7} "
          f"{'false eps/run':>13} {'events/s':>10}")  # fmt: skip
    for name, row in [*table.items(), ("T-squared baseline", baseline)]:
        found = f"{row['found']}/{row['segments']}"
        rate = f"{row['events_per_s']:10,.0f}" if "events_per_s" in row else f"{'':>10}"
        print(f"{name:24} {row['f1']:6.3f} {row['far_pct']:7.1f} {row['mar_pct']:7.1f} "
              f"{found:>7} {row['false_alarm_events'] / runs:13.1f} {rate}")  # fmt: skip
    if args.only:
        return  # a partial run prints; the results file holds full runs only
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "anomaly_skab",
        "machine": platform.platform(),
        "experiments": runs,
        "warmup_rows": WARMUP,
        "batch_rows": args.batch,
        "methods": table,
        "t_squared_baseline": baseline,
        "default_f1_over_baseline": table["likelihood (default)"]["f1"] / baseline["f1"],
    }
    (RESULTS / "anomaly_skab.json").write_text(json.dumps(out, indent=2) + "\n")


def _slug(method: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in method).strip("_")


if __name__ == "__main__":
    main()
