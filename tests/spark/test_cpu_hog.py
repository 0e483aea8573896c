"""Keyed queries keep running on a machine whose cores another process keeps busy: no
failed Python worker start, no restart loop, exact state (issue 34)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

import spanflow as sf
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_records, wait_for
from tests.spark.processors import RunningMean

pytestmark = pytest.mark.slow

BASE = 1_800_000_000
SCHEMA = {"id": "long", "device": "string", "v": "double", "ts": "timestamp"}
DEVICES = 20
CHUNKS = 6
PER_CHUNK = 200


@pytest.fixture
def cpu_hog() -> Iterator[list[subprocess.Popen[bytes]]]:
    """One busy loop per core (2 here), at the same priority as Spark."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)


def test_keyed_queries_keep_running_exactly_beside_a_cpu_hog(
    spark, nats_url, checkpoints, uid, cpu_hog
):
    stream, out = f"IN_{uid}", f"OUT_{uid}"
    flow = (
        sf.Pipeline(f"hog-{uid}", trigger=0)
        .source(stream, schema=SCHEMA, key="device", max_rows_per_batch=150)
        .process(RunningMean, output_schema={"device": "string", "n": "long", "mean": "double"})
        .sink_jetstream(out, subject=f"out{uid}")
    )
    records = [
        {"id": i, "device": f"d{i % DEVICES}", "v": float(i % 97), "ts": BASE + i}
        for i in range(CHUNKS * PER_CHUNK)
    ]
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions=flow.functions
    ).start()
    try:
        assert all(h.poll() is None for h in cpu_hog)
        for c in range(CHUNKS):  # several micro-batches, each started under load
            chunk = records[c * PER_CHUNK : (c + 1) * PER_CHUNK]
            publish(nats_url, stream, f"in{uid}.r", chunk)
            done = (c + 1) * PER_CHUNK
            wait_for(lambda d=done: _counted(nats_url, out) >= d, timeout=240)
        statuses = runner.status()
        assert all(h.poll() is None for h in cpu_hog)  # the load lasted the whole run
    finally:
        runner.stop()
    assert all(s.active for s in statuses)
    assert sum(s.restarts for s in statuses) == 0
    latest = {r["device"]: r for r in read_records(nats_url, out)}
    for d in range(DEVICES):
        values = [r["v"] for r in records if r["device"] == f"d{d}"]
        assert latest[f"d{d}"]["n"] == len(values)
        assert latest[f"d{d}"]["mean"] == pytest.approx(sum(values) / len(values))


def _counted(nats_url: str, out: str) -> int:
    latest: dict[str, int] = {}
    for row in read_records(nats_url, out):
        latest[row["device"]] = max(latest.get(row["device"], 0), row["n"])
    return sum(latest.values())
