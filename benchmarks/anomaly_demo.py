"""The demo's anomaly score line, offline: the demo's simulated machines (two factories,
six machines each, 100 readings/s per factory, the demo's seeds, its injected anomaly
kinds and overheats) through the demo's ``detect_anomalies`` step settings, episodes as
the demo reports them (``quiet: 10s``), scored against what the simulators injected by
the demo's own scorer (:func:`spanflow.simulator.episode_report`) — without starting a
cluster, so that methods can be compared in one run on the same readings.

The readings are generated as the demo's simulators generate them, in event-time
order per machine (the step orders a micro-batch by event time; the demo's late
readings, up to 3 s, are scored when they come, which this does not model), malformed
ones left out (the source dead-letters them).

Printed per method: detected episodes that were injected ones (episode precision),
flagged readings inside injected anomalies, and injected episodes found per kind.
Written to ``benchmarks/results/anomaly_demo.json``.

The demo's settings were chosen on runs 0 to 2 (the simulators' seeds of those runs);
``--first 3 --runs 8`` checks them on runs they were not chosen on.

Run: ``.venv/bin/python benchmarks/anomaly_demo.py [--seconds 180] [--first 0] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import json
import platform
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SITES = ("factory-a", "factory-b")
FIELDS = ("temperature", "vibration")
DEMO_PARAMS = {"extreme_sigma": 6, "sigma": 5, "confirm": 3, "stuck": 10}
METHODS: dict[str, dict[str, Any]] = {
    "the demo's: likelihood, sigma 5, confirm 3, stuck 10": {
        "method": "likelihood",
        "params": DEMO_PARAMS,
    },
    "the demo's before: likelihood, extreme_sigma 6": {
        "method": "likelihood",
        "params": {"extreme_sigma": 6},
    },
    "default over two fields: multivariate": {},
}


def readings(seconds: float, rate: float, devices: int, run: int) -> tuple[list, list]:
    """(records, injected episodes) of both factories, as the demo's simulators make them."""
    from spanflow.simulator import SensorSimulator, SimulatorConfig

    sims = [
        SensorSimulator(
            SimulatorConfig(
                devices=devices, rate=rate, site=site, anomaly_rate=0.01, overheat_rate=0.01,
                seed=i + 100 * run,
            )
        )
        for i, site in enumerate(SITES)
    ]  # fmt: skip
    records = []
    start = 1_800_000_000.0
    for k in range(int(seconds * rate)):
        now = start + k / rate
        for sim in sims:
            _, payload = sim.reading(now)
            record = _parsed(payload)
            if record is not None:
                records.append(record)
    return records, [e for sim in sims for e in sim.stats.injected]


def _parsed(payload: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(payload)
        record["ts"] = datetime.fromisoformat(record["ts"])
        if not all(isinstance(record.get(f), int | float) for f in FIELDS):
            return None
    except (ValueError, KeyError):
        return None
    return dict(record)


def detect(
    records: list[dict[str, Any]], settings: dict[str, Any]
) -> tuple[list[Any], dict[tuple[str, str], float]]:
    """The step's episodes per machine (DetectedEpisode of each end row), and when
    each machine's warm-up ended (the event time of its last warm-up reading)."""
    from spanflow.ml.anomaly import judge
    from spanflow.ml.detectors import make_detector
    from spanflow.ml.episodes import Episodes
    from spanflow.ml.thresholds import make_threshold
    from spanflow.simulator import DetectedEpisode
    from spanflow.spec.steps.models import DetectAnomaliesStep

    step = DetectAnomaliesStep(
        id="anomalies", fields=FIELDS, emit="episodes", quiet="10s", **settings
    )
    season = step.season_seconds(has_event_time=True)
    by_machine: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_machine[(r["site"], r["device"])].append(r)
    out = []
    learned: dict[tuple[str, str], float] = {}
    for (site, device), rows in by_machine.items():
        rows.sort(key=lambda r: r["ts"])
        warmup = min(step.warmup_or_default, len(rows)) - 1
        learned[(site, device)] = rows[warmup]["ts"].timestamp()
        detector = make_detector(step.method_or_default, FIELDS, step.detector_params(), season)
        threshold = make_threshold(step.threshold_or_default)
        times = [r["ts"] for r in rows]
        verdicts = judge(detector, detector.load(None), threshold, threshold.empty(), rows,
                         times, step.warmup_or_default)  # fmt: skip
        _, seconds = step.quiet_readings_or_seconds()
        tracker = Episodes(quiet_seconds=seconds)
        state = tracker.empty()
        for at, (score, flag, field) in zip(times, verdicts, strict=True):
            for row in tracker.step(state, at, score, flag, field):
                if row["episode"] == "end":
                    out.append(_detected(site, device, row, DetectedEpisode))
        if state.get("open"):
            out.append(_detected(site, device, tracker.end(state), DetectedEpisode))
    return out, learned


def _detected(site: str, device: str, row: dict[str, Any], kind: Any) -> Any:
    start = row["episode_start"].timestamp()
    end = (row["episode_end"] or row["episode_start"]).timestamp()
    return kind(site, device, start, end, row["anomalies"])


def _found(runs: list[dict[str, Any]]) -> str:
    """Injected episodes found per kind over the runs, e.g. ``spike 5/6``."""
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in runs:
        for kind, (found, injected) in r["found"].items():
            kinds[kind][0] += found
            kinds[kind][1] += injected
    return ", ".join(f"{k} {f}/{n}" for k, (f, n) in sorted(kinds.items()))


def _missing(runs: list[dict[str, Any]], key: str) -> int:
    """Runs in which an injected kind was not found at all."""
    return sum(any(f == 0 < n for f, n in r[key].values()) for r in runs)


def main() -> None:
    from spanflow.simulator import episode_report

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--rate", type=float, default=100.0, help="readings/s per factory")
    parser.add_argument("--devices", type=int, default=6, help="machines per factory")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--first", type=int, default=0, help="the first run's number")
    args = parser.parse_args()
    table: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    for run in range(args.first, args.first + args.runs):
        records, injected = readings(args.seconds, args.rate, args.devices, run)
        for name, settings in METHODS.items():
            detected, learned = detect(records, settings)
            report = episode_report(detected, injected)
            # what a detector could find: the episodes injected after its warm-up
            after = [e for e in injected if e.start > learned[(e.site, e.device)]]
            found_after = episode_report(detected, after).found
            table[name].append(
                {
                    "episodes": report.episodes,
                    "true_episodes": report.true_episodes,
                    "flagged": report.flagged,
                    "flagged_inside": report.flagged_inside,
                    "found": report.found,
                    "found_after_warmup": found_after,
                }
            )
            print(f"run {run}: {name}: {report.summary()}; after the warm-up: "
                  f"{_found([{'found': found_after}])}")  # fmt: skip
    print("episode precision over the runs (detected episodes that were injected ones):")
    for name, runs in table.items():
        true = sum(r["true_episodes"] for r in runs)
        total = sum(r["episodes"] for r in runs)
        print(f"  {name:54} {true}/{total} ({100 * true / max(total, 1):.0f} %); "
              f"found {_found(runs)}; runs with an injected kind not found: "
              f"{_missing(runs, 'found')}, of those injected after the warm-up: "
              f"{_missing(runs, 'found_after_warmup')}")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    out = {"benchmark": "anomaly_demo", "machine": platform.platform(), **vars(args),
           "methods": table}  # fmt: skip
    name = "anomaly_demo.json" if args.first == 0 else f"anomaly_demo_from_{args.first}.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
