"""Anomaly detection on a real industrial pump: the SKAB experiments in
``../shared/skab`` (a water-circulation testbed, 8 sensors at 1 Hz; in each experiment
about 400 normal rows, then a fault induced and later undone), scored by SKAB's own
rules with ``../shared/skab/score.py``: per-row F1, false alarm rate (FAR) and missed
alarm rate (MAR) after each experiment's 400 training rows, plus events (faults found,
false alarm episodes).

Each spanflow method runs as the ``detect_anomalies`` step runs in Spark: the step's
keyed processor through spanflow's processor harness, one key per experiment, all 8
fields, rows in time order cut into micro-batches of ``--batch`` rows (state saved and
restored between batches, as Spark's state store does); its ``is_anomaly`` flags are
what is scored. Rows:

* **default**: the step with no settings at all (over 8 fields: ``multivariate``, its
  normal fitted on each experiment's first 400 readings — the default warm-up);
* **default, leave one experiment out**: for each experiment in turn, the candidate
  settings (``CANDIDATES``: warm-up, limit, persistence, release, smoothing) are
  judged on the other experiments — the best F1 among those with FAR <= 15 %, every
  fault found and at most one false alarm episode per run — and the held-out one is
  flagged with them: the figure a default chosen this way earns on a run it never saw;
* **fitted from history**: the ``multivariate`` normal fitted on
  ``anomaly-free/anomaly-free.csv`` (9,405 rows of the testbed running normally on
  another day: the history a plant has before its first fault), as ``spanflow
  detector fit`` fits it, then used on every experiment from its first reading;
* **fitted from history, anchor 50**: the same normal, its levels taken from each
  experiment's first 50 readings, which also check its spreads: where they are not
  the experiment's (a factor of 2 either way), the experiment learns online (how
  many did is printed);
* ``mewma`` (the textbook MEWMA T-squared chart, the method before) and
  ``likelihood`` (univariate, per field), each with ``warmup: 400``.

Baseline from the same run: Hotelling's T-squared fitted on each experiment's first
400 rows, flagged above the 99th percentile of its training values (computed by
``score.py`` from the data alone).

Printed: F1, FAR, MAR, faults found and false alarm episodes (in all, and in the
worst run) per method beside the baseline, and events/s of each method's per-key code.
Written to ``benchmarks/results/anomaly_skab.json``.

Run: ``.venv/bin/python benchmarks/anomaly_skab.py [--skab ../shared/skab] [--batch 200]``.
"""

from __future__ import annotations

import argparse
import csv
import itertools
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
TRAIN = 400
HISTORY = "anomaly-free"
DEFAULT = "default (multivariate)"
ANCHOR = 50
# name -> (method, settings); None: the step's defaults
METHODS: dict[str, tuple[str | None, dict[str, Any]]] = {
    DEFAULT: (None, {}),
    "fitted from history": ("multivariate", {"history": True}),
    f"fitted from history, anchor {ANCHOR}": (
        "multivariate",
        {"history": True, "params": {"anchor": ANCHOR}},
    ),
    "mewma, warmup 400": ("mewma", {"warmup": TRAIN}),
    "likelihood, warmup 400": ("likelihood", {"warmup": TRAIN}),
}
CANDIDATES = [
    {"warmup": w, "params": {"limit": lim, "persist": k, "window": n, "release": r, "smoothing": a}}
    for w, lim, (k, n), r, a in itertools.product(
        (300, 400), (4.0, 5.0, 6.0), ((1, 1), (5, 10), (10, 20)), (0.3, 0.5), (0.1, 0.2)
    )
]
"""The settings leave-one-experiment-out chooses among (the defaults are one of them)."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter=";"))
    return [
        {
            "ts": datetime.fromisoformat(r["datetime"]).replace(tzinfo=UTC),
            **{name: float(r[name]) for name in FIELDS},
        }
        for r in rows
    ]


def labels(path: Path) -> list[int]:
    with open(path) as f:
        return [int(float(r["anomaly"])) for r in csv.DictReader(f, delimiter=";")]


def history_model(skab: Path) -> Any:
    """The multivariate normal of the anomaly-free history, as ``detector fit`` fits it."""
    from spanflow.ml.multivariate import DEFAULTS
    from spanflow.ml.normal import fit_normal

    rows = read_rows(skab / "data" / HISTORY / f"{HISTORY}.csv")
    normal, _ = fit_normal(
        [[r[f] for f in FIELDS] for r in rows], FIELDS,
        smoothing=DEFAULTS["smoothing"], gain=DEFAULTS["gain"], clip=DEFAULTS["clip"],
    )  # fmt: skip
    return normal.plain()


def run_processor(
    method: str | None, settings: dict[str, Any], rows: list[dict[str, Any]], batch: int,
    model: dict[str, Any] | None = None,
) -> list[tuple[float, bool]]:  # fmt: skip
    """The detect_anomalies step's keyed processor over one experiment."""
    from anomaly_step import step_harness

    from spanflow.spec.steps.models import DetectAnomaliesStep

    step = DetectAnomaliesStep(
        id="detect", fields=FIELDS, method=method,
        **{k: v for k, v in settings.items() if k in ("warmup", "params")},
    )  # fmt: skip
    schema = {"run": "string", "ts": "timestamp", **dict.fromkeys(FIELDS, "double")}
    harness = step_harness(step, "run", schema, model=model)
    out: list[tuple[float, bool]] = []
    for lo in range(0, len(rows), batch):
        chunk = [{"run": "r", **row} for row in rows[lo : lo + batch]]
        out += [(r["anomaly_score"], bool(r["is_anomaly"])) for r in harness.process(chunk)]
    return out


def quick_flags(settings: dict[str, Any], rows: list[dict[str, Any]]) -> list[bool]:
    """The default method's flags under other settings, without the harness (the same
    detector and threshold the step builds; the harness's state round trips do not
    change a score: tests/ml/test_multivariate.py)."""
    from spanflow.ml.anomaly import judge
    from spanflow.ml.detectors import make_detector
    from spanflow.ml.thresholds import make_threshold

    params = {**settings["params"], "warmup": settings["warmup"]}
    detector = make_detector("multivariate", FIELDS, params, None)
    threshold = make_threshold(0.5)
    verdicts = judge(detector, detector.load(None), threshold, {}, rows, None, settings["warmup"])
    return [flag for _, flag, _ in verdicts]


def run_one(args: tuple[str, str, str, int, dict[str, Any] | None]) -> tuple[str, float, int]:
    """One method on one experiment: its results file; (method, seconds, rows)."""
    name, data_file, out_file, batch, model = args
    method, settings = METHODS[name]
    rows = read_rows(Path(data_file))
    run_processor(method, settings, rows[:50], batch, model)  # imports, first calls: not timed
    started = time.perf_counter()
    verdicts = run_processor(method, settings, rows, batch, model)
    elapsed = time.perf_counter() - started
    write_flags(Path(out_file), rows, verdicts)
    return name, elapsed, len(rows)


def write_flags(path: Path, rows: list[dict[str, Any]], verdicts: list[tuple[float, bool]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["datetime", "is_anomaly", "anomaly_score"])
        for row, (score, flag) in zip(rows, verdicts, strict=True):
            w.writerow([row["ts"].isoformat(), int(flag), min(1.0, max(0.0, score))])


def score(data: Path, results: Path) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sys.executable, str(data.parent / "score.py"), "--data", str(data),
             "--results", str(results), "--json", out.name],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        return dict(json.loads(Path(out.name).read_text()))


def labelled_data(skab: Path, into: Path) -> tuple[Path, list[Path]]:
    """A data folder holding only the labelled experiments (the history has no labels
    and is never scored): links under ``into``; and the experiments."""
    data = into / "data"
    experiments = sorted(p for p in (skab / "data").glob("*/*.csv") if p.parent.name != HISTORY)
    for p in experiments:
        (data / p.parent.name).mkdir(parents=True, exist_ok=True)
        (data / p.parent.name / p.name).symlink_to(p)
    (into / "score.py").symlink_to(skab / "score.py")
    return data, experiments


def leave_one_out(experiments: list[Path], workers: int) -> list[list[bool]]:
    """Per experiment, the flags of the candidate settings best on the others."""
    from skab_events import judge_runs

    runs = [read_rows(p) for p in experiments]
    truth = [labels(p) for p in experiments]
    jobs = [(c, rows) for c in CANDIDATES for rows in runs]
    with ProcessPoolExecutor(workers) as pool:
        flat = list(pool.map(_quick, jobs, chunksize=8))
    flags = [flat[i * len(runs) : (i + 1) * len(runs)] for i in range(len(CANDIDATES))]
    chosen = []
    for held in range(len(runs)):
        others = [i for i in range(len(runs)) if i != held]

        def merit(c: int, others: list[int] = others) -> tuple[bool, float]:
            r = judge_runs([truth[i] for i in others], [flags[c][i] for i in others], TRAIN)
            ok = r["far_pct"] <= 15 and r["found"] == r["segments"] and r["worst_run"] <= 1
            return ok, r["f1"]

        chosen.append(flags[max(range(len(CANDIDATES)), key=merit)][held])
    return chosen


def _quick(job: tuple[dict[str, Any], list[dict[str, Any]]]) -> list[bool]:
    return quick_flags(*job)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skab", type=Path, default=DEFAULT_SKAB, help="the SKAB folder")
    parser.add_argument("--batch", type=int, default=200, help="rows per micro-batch")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--only", action="append", metavar="METHOD", help="run just this method (repeatable)"
    )
    args = parser.parse_args()
    names = [m for m in METHODS if not args.only or m in args.only]
    timing = {m: [0.0, 0] for m in names}
    table: dict[str, Any] = {}
    model = history_model(args.skab)
    with tempfile.TemporaryDirectory() as tmp:
        data, experiments = labelled_data(args.skab, Path(tmp) / "skab")
        root = Path(tmp) / "results"
        jobs = [
            (m, str(p), str(root / _slug(m) / p.parent.name / p.name), args.batch,
             model if METHODS[m][1].get("history") else None)
            for m in names
            for p in experiments
        ]  # fmt: skip
        started = time.monotonic()
        with ProcessPoolExecutor(args.workers) as pool:
            for done, (name, seconds, rows) in enumerate(pool.map(run_one, jobs), 1):
                timing[name][0] += seconds
                timing[name][1] += rows
                print(f"\r{done}/{len(jobs)} experiment runs ({time.monotonic() - started:.0f} s)",
                      end="" if sys.stdout.isatty() else "\n", flush=True)  # fmt: skip
        print()
        for m in names:
            report = score(data, root / _slug(m))
            table[m] = {**report["detector"], "events_per_s": timing[m][1] / timing[m][0]}
            baseline = report["t_squared_baseline"]
        if not args.only:
            held = leave_one_out(experiments, args.workers)
            for p, flags in zip(experiments, held, strict=True):
                write_flags(root / "loeo" / p.parent.name / p.name, read_rows(p),
                            [(float(f), f) for f in flags])  # fmt: skip
            table["default, leave one experiment out"] = score(data, root / "loeo")["detector"]
        worst = _worst_runs(experiments, root, [*names, "loeo"] if not args.only else names)
    for m, w in worst.items():
        table["default, leave one experiment out" if m == "loeo" else m]["worst_run"] = w
    print_table(table, baseline, len(experiments))
    online = fell_back(model, experiments)
    print(f"with anchor {ANCHOR}, the history's spreads were not the run's on {online} of "
          f"{len(experiments)} runs, which learned online")  # fmt: skip
    if args.only:
        return  # a partial run prints; the results file holds full runs only
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "anomaly_skab",
        "machine": platform.platform(),
        "experiments": len(experiments),
        "training_rows": TRAIN,
        "history_rows": model["rows"],
        "batch_rows": args.batch,
        "methods": table,
        "anchor_fell_back_to_online": online,
        "t_squared_baseline": baseline,
        "default_f1_over_baseline": table[DEFAULT]["f1"] / baseline["f1"],
    }
    (RESULTS / "anomaly_skab.json").write_text(json.dumps(out, indent=2) + "\n")


def fell_back(model: dict[str, Any], experiments: list[Path]) -> int:
    """How many experiments the history's normal did not fit (with ``anchor``), so
    that they learned online."""
    from spanflow.ml.multivariate import MultivariateDetector
    from spanflow.ml.normal import Normal

    detector = MultivariateDetector(FIELDS, model=Normal.from_plain(model), anchor=ANCHOR)
    count = 0
    for p in experiments:
        live = detector.load(None)
        for row in read_rows(p)[:ANCHOR]:
            detector.step(live, row, None)
        count += live.online
    return count


def _worst_runs(experiments: list[Path], root: Path, names: list[str]) -> dict[str, int]:
    """The most false alarm episodes any one experiment had, per method."""
    from skab_events import false_episodes

    out = {}
    for m in names:
        folder = root / (m if m == "loeo" else _slug(m))
        out[m] = max(
            false_episodes(labels(p), _read_flags(folder / p.parent.name / p.name), TRAIN)
            for p in experiments
        )
    return out


def _read_flags(path: Path) -> list[bool]:
    with open(path) as f:
        return [r["is_anomaly"] == "1" for r in csv.DictReader(f)]


def print_table(table: dict[str, Any], baseline: dict[str, Any], runs: int) -> None:
    print(f"SKAB, {runs} experiments, 8 sensors; scored after each one's {TRAIN} training rows")
    print(f"{'method':36} {'F1':>6} {'FAR %':>7} {'MAR %':>7} {'faults':>7} "
          f"{'false eps':>9} {'worst run':>9} {'events/s':>10}")  # fmt: skip
    for name, row in [*table.items(), ("T-squared baseline", baseline)]:
        found = f"{row['found']}/{row['segments']}"
        rate = f"{row['events_per_s']:10,.0f}" if "events_per_s" in row else f"{'':>10}"
        worst = f"{row['worst_run']:9}" if "worst_run" in row else f"{'':>9}"
        print(f"{name:36} {row['f1']:6.3f} {row['far_pct']:7.1f} {row['mar_pct']:7.1f} "
              f"{found:>7} {row['false_alarm_events']:9} {worst} {rate}")  # fmt: skip


def _slug(method: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in method).strip("_")


if __name__ == "__main__":
    main()
