"""Workloads shared by the tests of external sinks (PostgreSQL, MongoDB, S3, ...)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import spanflow as sf
from tests.helpers import publish

BASE = 1_800_000_000
SCHEMA = {"id": "long", "device": "string", "v": "double", "ts": "timestamp"}


def readings(uid: str, prefix: str, n: int = 40) -> tuple[list[dict[str, Any]], sf.Stream]:
    """``n`` readings of two devices, 0.5 s apart, and a pipeline's source of them
    (stream ``<PREFIX>_<uid>``, subjects ``<prefix><uid>.>``)."""
    records = [
        {"id": i, "device": "ab"[i % 2], "v": float(i), "ts": BASE + i * 0.5} for i in range(n)
    ]
    source = sf.Pipeline(f"{prefix}-{uid}", trigger="0.5s").source(
        f"{prefix.upper()}_{uid}", subjects=[f"{prefix}{uid}.>"], schema=SCHEMA,
        event_time="ts", max_out_of_orderness="1s",
    )  # fmt: skip
    return records, source


def windows_of(stream: sf.Stream) -> sf.Stream:
    """Count and sum per device and 5 s window, every update emitted."""
    return (
        stream.key_by("device")
        .window(tumbling="5s")
        .aggregate(emit="updates", n="count", total="sum(v)")
    )


def expected_windows(records: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[int, float]]:
    """(device, window start in epoch seconds) → (count, sum) of ``windows_of``."""
    counts: Counter[tuple[str, int]] = Counter()
    totals: Counter[tuple[str, int]] = Counter()
    for r in records:
        key = (r["device"], int((r["ts"] // 5) * 5))
        counts[key] += 1
        totals[key] += r["v"]
    return {k: (counts[k], totals[k]) for k in counts}


def publish_readings(nats_url: str, uid: str, prefix: str, records: list[dict[str, Any]]) -> None:
    publish(nats_url, f"{prefix.upper()}_{uid}", f"{prefix}{uid}.r", records)


def crash_pipeline(
    nats_url: str, tmp_path: Path, uid: str, prefix: str, n: int, sink: str
) -> tuple[list[dict[str, Any]], Path]:
    """For a crash test: ``n`` readings published to a stream, and a pipeline file that
    reads them 200 a batch and writes them with the sink given as the body of a YAML
    flow mapping (``type: s3, bucket: b``)."""
    records = [{"id": i, "device": "abc"[i % 3], "v": float(i), "ts": BASE + i} for i in range(n)]
    publish_readings(nats_url, uid, prefix, records)
    return records, _write(
        tmp_path,
        f"""
name: {prefix}-{uid}
trigger: 0s
sources:
  - {{id: in, stream: {prefix.upper()}_{uid}, subjects: ["{prefix}{uid}.>"],
     max_rows_per_batch: 200, schema: {{id: long, device: string, v: double, ts: timestamp}},
     to: [out]}}
sinks:
  - {{id: out, {sink}}}
""",
    )


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path
