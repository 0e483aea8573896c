"""Every example runs: its Python and YAML forms are the same pipeline, and that
pipeline, fed the example's data on real Spark and JetStream, prints exactly what a
plain-Python oracle computes."""

from __future__ import annotations

import importlib
import json
import re
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import spanflow as sf
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _data(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (EXAMPLES / "data" / name).read_text().splitlines()]


def _normal(spec: sf.PipelineSpec) -> dict:
    data = json.loads(spec.to_json())
    data["steps"].sort(key=lambda s: s["id"])
    return data


def _same_pipeline(module: str, yaml_file: str) -> sf.Flow:
    flow = importlib.import_module(f"examples.{module}").flow
    assert _normal(sf.load_pipeline(EXAMPLES / yaml_file)) == _normal(flow.spec())
    return flow


class _Printed:
    """What the console sink prints, batch by batch."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []

    def __call__(self, sink: str, batch: int, rows: list[dict[str, Any]]) -> None:
        self.batches.append(rows)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for b in self.batches for r in b]


def _run(spark, nats_url, checkpoints, flow, feeds: dict[str, list], done) -> _Printed:
    printed = _Printed()
    runner = PipelineRunner(
        spark,
        flow.spec(),
        nats_url=nats_url,
        checkpoint_dir=checkpoints,
        functions=flow.functions,
        on_rows=printed,
        console_limit=100_000,
    ).start()
    try:
        for subject, records in feeds.items():
            publish(nats_url, subject.split(".")[0].upper(), subject, records)
        wait_for(lambda: done(printed))
        runner.await_idle()
    finally:
        runner.stop()
    return printed


def test_word_count(spark, nats_url, checkpoints):
    flow = _same_pipeline("word_count", "word_count.yaml")
    lines = _data("lines.jsonl")
    words = Counter(w for ln in lines for w in re.split(r"[^a-z0-9]+", ln["line"].lower()) if w)

    def latest(printed: _Printed) -> dict[str, int]:
        return {r["word"]: r["count"] for r in printed.rows}

    printed = _run(
        spark, nats_url, checkpoints, flow, {"lines.feed": lines}, lambda p: latest(p) == words
    )
    assert latest(printed) == dict(words)


def test_sliding_windows(spark, nats_url, checkpoints):
    flow = _same_pipeline("sliding_windows", "sliding_windows.yaml")
    readings = _data("readings.jsonl")
    clock = max(_secs(r["ts"]) for r in readings) - 5  # the watermark at the end
    windows: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in readings:
        t = _secs(r["ts"])
        for start in (t // 5 * 5, t // 5 * 5 - 5):
            if start + 10 <= clock:  # closed by the last reading's watermark
                windows[(r["device"], start)].append(r["temperature"])
    expected = {k: (len(v), sum(v) / len(v), max(v)) for k, v in windows.items()}

    def got(printed: _Printed) -> dict:
        return {
            (r["device"], int(r["window_start"].timestamp())): (
                r["n"],
                round(r["mean"], 9),
                r["hottest"],
            )
            for r in printed.rows
        }

    printed = _run(
        spark,
        nats_url,
        checkpoints,
        flow,
        {"readings.feed": readings},
        lambda p: len(got(p)) >= len(expected),
    )
    assert got(printed) == expected
    assert len(printed.rows) == len(expected)  # each window printed once, when final


def test_dedup_with_a_keyed_processor(spark, nats_url, checkpoints):
    flow = _same_pipeline("dedup", "dedup.yaml")
    sent = _data("resent.jsonl")
    first = {}
    for r in sent:
        first.setdefault(r["reading_id"], r)
    printed = _run(
        spark,
        nats_url,
        checkpoints,
        flow,
        {"resent.feed": sent},
        lambda p: len(p.rows) >= len(first),
    )
    assert sorted(printed.rows, key=lambda r: r["reading_id"]) == [first[k] for k in sorted(first)]


def test_stream_join(spark, nats_url, checkpoints):
    flow = _same_pipeline("stream_join", "stream_join.yaml")
    temps, pressures = _data("temps.jsonl"), _data("pressures.jsonl")
    expected = sorted(
        (t["device"], _secs(t["ts"]), t["temp"], _secs(p["ts"]), p["pressure"])
        for t in temps
        for p in pressures
        if t["device"] == p["device"]
        and abs(_secs(p["ts"]) - _secs(t["ts"])) <= 5
        and t["temp"] > 80
        and p["pressure"] < 2
    )

    def got(printed: _Printed) -> list:
        return sorted(
            (
                r["device"],
                int(r["ts"].timestamp()),
                r["temp"],
                int(r["pressure_ts"].timestamp()),
                r["pressure"],
            )
            for r in printed.rows
        )

    printed = _run(
        spark,
        nats_url,
        checkpoints,
        flow,
        {"temps.line1": temps, "pressures.line1": pressures},
        lambda p: len(p.rows) >= len(expected),
    )
    assert expected and got(printed) == expected


def _secs(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())
