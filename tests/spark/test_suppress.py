"""``suppress`` and a sink's ``once_per``: one record per key per period or incident."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import spanflow as sf
from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.errors import PipelineFileError
from spanflow.spark.keyed.builtins import Suppression
from spanflow.spec.steps.alarms import SuppressStep
from spanflow.testing import KeyedProcessorTest
from tests.helpers import publish, read_records, wait_for

T0 = datetime(2026, 3, 1, tzinfo=UTC)
SCHEMA = {"device": "string", "ts": "timestamp", "n": "long"}


def _oracle(times: list[float], once_per: float, quiet: bool) -> list[tuple[int, int]]:
    """(index, held back before it) of each record that passes, by the definition."""
    out, last_passed, last_seen, held = [], None, None, 0
    for i, t in enumerate(times):
        ref = last_seen if quiet else last_passed
        if ref is None or t - ref >= once_per:
            out.append((i, held))
            last_passed, held = t, 0
        else:
            held += 1
        last_seen = t if last_seen is None else max(last_seen, t)
    return out


def _bursts(seed: int) -> list[float]:
    """Seconds of readings in bursts (an incident) with silences between."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(12):
        for _ in range(rng.randint(1, 40)):
            t += rng.choice([1.0, 2.0, 5.0])
            out.append(t)
        t += rng.choice([30.0, 90.0, 400.0])
    return out


@pytest.mark.parametrize("until", ["period", "quiet"])
def test_suppression_matches_its_definition_across_batches(until: str) -> None:
    times = {"a": _bursts(1), "b": _bursts(2)}
    t = KeyedProcessorTest(
        Suppression,
        key="device",
        event_time="ts",
        output_schema={**SCHEMA, "suppressed": "long"},
        params={"once_per": 60.0, "until": until, "event_time": "ts"},
    )
    records = [
        {"device": d, "ts": T0 + timedelta(seconds=s), "n": i}
        for d, seconds in times.items()
        for i, s in enumerate(seconds)
    ]
    records.sort(key=lambda r: r["ts"])
    got: list[dict[str, Any]] = []
    for lo in range(0, len(records), 37):
        got += t.process(records[lo : lo + 37])
    for device, seconds in times.items():
        expected = _oracle(seconds, 60.0, until == "quiet")
        passed = [(r["n"], r["suppressed"]) for r in got if r["device"] == device]
        assert passed == expected
        assert 1 < len(passed) < len(seconds)  # something passed, something was held


def test_a_sinks_once_per_is_a_suppress_step_in_front_of_it() -> None:
    spec = (
        sf.Pipeline("p")
        .source("S", schema=SCHEMA, key="device")
        .filter("n > 3")
        .sink_jetstream("OUT", subject="out")
        .spec()
    )
    sink = spec.sinks()[0].model_copy(update={"once_per": 300.0, "until": "quiet"})
    guard, written = sink.expand()
    assert isinstance(guard, SuppressStep) and (guard.once_per, guard.until) == (300.0, "quiet")
    assert guard.inputs == sink.inputs and written.inputs == (guard.id,)
    assert written.id == sink.id and written.once_per is None  # type: ignore[attr-defined]


def test_a_bad_once_per_names_its_line_and_field() -> None:
    text = """\
name: p
sources:
  - {id: s, stream: S, schema: {device: string}, key: device, to: [out]}
sinks:
  - id: out
    type: jetstream
    stream: OUT
    subject: out
    once_per: -5m
"""
    with pytest.raises(PipelineFileError, match=r"p.yaml:9: sinks\[0\].once_per"):
        load_pipeline_text(text, "p.yaml")


ALERTS = """\
name: alerts-{uid}
trigger: 0
sources:
  - id: readings
    stream: IN_{uid}
    subjects: ["in{uid}.>"]
    schema: {{device: string, ts: timestamp, n: long, temperature: double}}
    key: device
    event_time: ts
    to: [hot]
processors:
  - {{id: hot, type: filter, where: "temperature > 90", to: [alerts_out]}}
sinks:
  - id: alerts_out
    type: jetstream
    stream: ALERTS_{uid}
    subject: "alerts{uid}.{{device}}"
    once_per: 1m
    until: quiet
"""


def test_an_alert_sink_with_once_per_writes_one_record_per_incident(
    spark: Any, nats_url: str, checkpoints: str, uid: str
) -> None:
    from spanflow.spark.runner import PipelineRunner

    def reading(device: str, second: int, n: int) -> dict[str, Any]:
        ts = (T0 + timedelta(seconds=second)).isoformat().replace("+00:00", "Z")
        return {"device": device, "ts": ts, "n": n, "temperature": 95.0}

    # a: one 300 s overheat, 100 s of quiet, a second one; b: one overheat
    a = [reading("a", s, s) for s in range(300)] + [
        reading("a", 400 + s, 400 + s) for s in range(5)
    ]
    b = [reading("b", 50 + s, 1000 + s) for s in range(20)]
    spec = load_pipeline_text(ALERTS.format(uid=uid), "alerts.yaml")
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        for lo in range(0, len(a), 100):
            publish(
                nats_url, f"IN_{uid}", f"in{uid}.r", a[lo : lo + 100] + b[lo // 5 : lo // 5 + 20]
            )
        wait_for(lambda: len(read_records(nats_url, f"ALERTS_{uid}")) >= 3, timeout=180)
        runner.await_idle()
    finally:
        runner.stop()
    got = sorted(
        (r["device"], r["n"], r["suppressed"]) for r in read_records(nats_url, f"ALERTS_{uid}")
    )
    assert got == [("a", 0, 0), ("a", 400, 299), ("b", 1000, 0)]
