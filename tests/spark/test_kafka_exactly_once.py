"""Kafka to Kafka exactly once through crashes: ``spanflow run`` is SIGKILLed mid-stream,
twice, and restarted from its checkpoint; a read_committed consumer of the output
topic sees every expected record once."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter

import pytest

from tests.helpers import run_pipeline_process, wait_for
from tests.kafka_helpers import create_topic, produce, read_values

pytestmark = pytest.mark.slow

N = 2000
DEVICES = ("a", "b", "c")


def _pipeline(uid: str, kafka: str) -> str:
    return f"""
name: keo-{uid}
trigger: 0s
sources:
  - id: readings
    type: kafka
    topic: in-{uid}
    bootstrap: "{kafka}"
    schema: {{id: long, device: string, v: long}}
    key: device
    max_rows_per_batch: 150
    to: [keep]
processors:
  - {{id: keep, type: filter, where: "v % 3 != 0", to: [double]}}
  - {{id: double, type: map, columns: {{v2: "v * 2"}}, to: [out]}}
sinks:
  - {{id: out, type: kafka, topic: out-{uid}, bootstrap: "{kafka}", key: device}}
"""


def _crash(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_kafka_outputs_exactly_once_across_sigkill_restarts(nats_url, kafka, tmp_path, uid):
    create_topic(kafka, f"in-{uid}", partitions=3)
    create_topic(kafka, f"out-{uid}", partitions=2)
    records = [{"id": i, "device": DEVICES[i % 3], "v": i} for i in range(N)]
    produce(kafka, f"in-{uid}", records, key="device")
    expected = Counter(r["id"] for r in records if r["v"] % 3 != 0)
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(uid, kafka))
    data_dir, log = tmp_path / "node", tmp_path / "run.log"

    def written() -> int:
        return len(read_values(kafka, f"out-{uid}"))

    for fraction in (0.15, 0.5):
        proc = run_pipeline_process(pipeline, nats_url, data_dir, log)
        try:
            wait_for(lambda f=fraction: written() >= len(expected) * f, timeout=180)
        finally:
            _crash(proc)
    proc = run_pipeline_process(pipeline, nats_url, data_dir, log)
    try:
        wait_for(lambda: written() >= sum(expected.values()), timeout=180)
    finally:
        proc.terminate()
        proc.wait(60)
    got = read_values(kafka, f"out-{uid}")
    assert Counter(r["id"] for r in got) == expected, log.read_text()[-3000:]
    assert all(r["v2"] == r["v"] * 2 for r in got)
