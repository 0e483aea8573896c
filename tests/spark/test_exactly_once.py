"""Exactly-once through crashes: a pipeline process is SIGKILLed mid-stream, twice, and
restarted from its checkpoint; both sinks hold every expected output exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter

import pytest

from tests.helpers import publish, read_all, read_records, run_pipeline_process, wait_for

pytestmark = pytest.mark.slow

BASE = 1_800_000_000
N = 3000
DEVICES = ("a", "b", "c")


def _pipeline(uid: str) -> str:
    return f"""
name: eo-{uid}
trigger: 0s
sources:
  - id: readings
    stream: IN_{uid}
    schema: {{id: long, device: string, v: long, ts: timestamp}}
    event_time: ts
    max_out_of_orderness: 2s
    max_rows_per_batch: 300
    to: [keep, by_device]
processors:
  - {{id: keep, type: filter, where: "v % 3 != 0", to: [double]}}
  - {{id: double, type: map, columns: {{v2: "v * 2"}}, to: [rows_out]}}
  - {{id: by_device, type: key_by, key: device, to: [per_10s]}}
  - id: per_10s
    type: window
    tumbling: 10s
    aggregates: {{n: count, total: sum(v)}}
    to: [windows_out]
sinks:
  - {{id: rows_out, type: jetstream, stream: ROWS_{uid}, subject: "rows{uid}"}}
  - {{id: windows_out, type: jetstream, stream: WIN_{uid}, subject: "win{uid}"}}
"""


_start = run_pipeline_process


def _crash(proc: subprocess.Popen[bytes]) -> None:
    """Kill the whole process tree at once, as a power cut would."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_outputs_exactly_once_across_sigkill_restarts(nats_url, tmp_path, uid):
    records = [{"id": i, "device": DEVICES[i % 3], "v": i, "ts": BASE + i * 0.1} for i in range(N)]
    flush = {"id": N, "device": "a", "v": 1, "ts": BASE + 100_000}  # closes every window
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", [*records, flush])
    expected_rows = {r["id"] for r in [*records, flush] if r["v"] % 3 != 0}
    windows: Counter[tuple[str, int]] = Counter()
    totals: Counter[tuple[str, int]] = Counter()
    for r in records:
        key = (r["device"], int(r["ts"] // 10 * 10))
        windows[key] += 1
        totals[key] += r["v"]

    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(uid))
    data_dir, log = tmp_path / "node", tmp_path / "run.log"

    def rows() -> int:
        return len(read_all(nats_url, f"ROWS_{uid}"))

    # Crash twice, each time once the pipeline has visibly made progress.
    for fraction in (0.15, 0.5):
        proc = _start(pipeline, nats_url, data_dir, log)
        target = int(len(expected_rows) * fraction)
        try:
            wait_for(lambda t=target: rows() >= t, timeout=240)
        except AssertionError:
            proc.kill()
            raise AssertionError(log.read_text()[-3000:]) from None
        _crash(proc)

    proc = _start(pipeline, nats_url, data_dir, log)
    try:
        wait_for(
            lambda: (
                rows() >= len(expected_rows)
                and len(read_all(nats_url, f"WIN_{uid}")) >= len(windows)
            ),
            timeout=300,
        )
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 0, "Ctrl-C should stop the pipeline cleanly"

    out_ids = Counter(r["id"] for r in read_records(nats_url, f"ROWS_{uid}"))
    assert set(out_ids) == expected_rows
    assert max(out_ids.values()) == 1, "a row was published twice"
    assert all(r["v2"] == r["v"] * 2 for r in read_records(nats_url, f"ROWS_{uid}"))

    got = Counter()
    for w in read_records(nats_url, f"WIN_{uid}"):
        from datetime import datetime

        key = (w["device"], int(datetime.fromisoformat(w["window_start"]).timestamp()))
        got[key] += 1
        assert w["n"] == windows[key] and w["total"] == totals[key], key
    assert set(got) == set(windows)
    assert max(got.values()) == 1, "a window was published twice"
    assert log.read_text().count("starting Spark") == 3
