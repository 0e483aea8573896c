"""Kafka in, Kafka out, exactly once on Apache Kafka when the pipeline dies at the two
worst moments of a sink transaction, each timed by a fault point (``spanflow.faults``):
first after the sink sent a batch's records and marker to the brokers and before it
commits (the brokers hold an open transaction when the process tree is SIGKILLed),
then after Kafka committed the batch and before Spark recorded it (the restarted
pipeline replays a batch Kafka already has).

A ``read_committed`` reader must then see every reading and every window once; a
``read_uncommitted`` reader sees the killed transaction's records too (its rows or
windows, and its marker), which proves the kill landed where it should. The second
test does the same on three brokers and SIGKILLs one of them with the pipeline; the
first reads with the Python reader, the second with Spark's own Kafka connector."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from spanflow.faults import FAULT_DIR_ENV
from spanflow.local.kafka_broker import LocalKafka
from tests.helpers import run_pipeline_process, wait_for
from tests.kafka_helpers import create_topic, produce, read_topic, read_values

pytestmark = pytest.mark.slow

N = 1800
BASE = 1_700_000_000
KILLS = [(0.15, "kafka-sink-open-transaction"), (0.5, "kafka-sink-committed")]
"""When (the share of rows out) and where each of the two runs is SIGKILLed."""


def _pipeline(uid: str, bootstrap: str, reader: str) -> str:
    return f"""
name: keo-{uid}
trigger: 0s
sources:
  - {{id: in, type: kafka, topic: in-{uid}, bootstrap: "{bootstrap}", max_rows_per_batch: 120,
     reader: {reader},
     schema: {{id: long, device: string, v: long, ts: timestamp}}, key: device,
     event_time: ts, max_out_of_orderness: 1s, to: [rows, by_device]}}
processors:
  - {{id: by_device, type: key_by, key: device, to: [per_10s]}}
  - {{id: per_10s, type: window, tumbling: 10s, aggregates: {{n: count}}, to: [windows]}}
sinks:
  - {{id: rows, type: kafka, topic: rows-{uid}, bootstrap: "{bootstrap}", key: device}}
  - {{id: windows, type: kafka, topic: win-{uid}, bootstrap: "{bootstrap}", key: device}}
"""


def _readings() -> list[dict[str, object]]:
    rows = [{"id": i, "device": "abc"[i % 3], "v": i, "ts": BASE + i * 0.1} for i in range(N)]
    return [*rows, {"id": N, "device": "a", "v": 0, "ts": BASE + 10_000}]  # closes windows


def _expected_windows(readings: list[dict[str, object]]) -> Counter[tuple[str, int]]:
    counts: Counter[tuple[str, int]] = Counter()
    for r in readings[:-1]:
        counts[(str(r["device"]), int(float(r["ts"]) // 10 * 10))] += 1  # type: ignore[arg-type]
    return counts


def _window_key(w: dict[str, object]) -> tuple[str, int]:
    from datetime import datetime

    start = datetime.fromisoformat(str(w["window_start"]).replace("Z", "+00:00"))
    return str(w["device"]), int(start.timestamp())


def _run_killing_in_transactions(
    pipeline: Path, nats_url: str, tmp_path: Path, bootstrap: str, uid: str,
    also_kill: list[LocalKafka] | None = None,
) -> Path:  # fmt: skip
    """Start ``spanflow run`` three times; the first two are SIGKILLed at the fault
    points of ``KILLS``; the last finishes."""
    faults, data_dir, log = tmp_path / "faults", tmp_path / "node", tmp_path / "run.log"
    faults.mkdir()
    os.environ[FAULT_DIR_ENV] = str(faults)
    try:
        for fraction, point in KILLS:
            proc = run_pipeline_process(pipeline, nats_url, data_dir, log)
            try:
                rows_out = lambda f=fraction: len(read_values(bootstrap, f"rows-{uid}")) >= N * f  # noqa: E731
                wait_for(rows_out, timeout=240)
                (faults / f"{point}.arm").touch()
                wait_for((faults / f"{point}.reached").exists, timeout=120)
            except AssertionError:
                raise AssertionError(log.read_text()[-3000:]) from None
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            (faults / f"{point}.reached").unlink()
            for cluster in also_kill or []:
                cluster.nodes[0].kill()
                also_kill = None  # one broker, once
    finally:
        del os.environ[FAULT_DIR_ENV]
    proc = run_pipeline_process(pipeline, nats_url, data_dir, log)
    try:
        windows = len(_expected_windows(_readings()))
        wait_for(lambda: len(read_values(bootstrap, f"win-{uid}")) >= windows, timeout=300)
        wait_for(lambda: len(read_values(bootstrap, f"rows-{uid}")) >= N + 1, timeout=120)
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    return log


def _check_exactly_once(bootstrap: str, uid: str, log: Path) -> None:
    readings = _readings()
    rows = Counter(r["id"] for r in read_values(bootstrap, f"rows-{uid}"))
    assert rows == Counter(r["id"] for r in readings), log.read_text()[-2000:]
    windows = read_values(bootstrap, f"win-{uid}")
    got = Counter(_window_key(w) for w in windows)
    assert max(got.values()) == 1, f"a window was committed twice: {got.most_common(3)}"
    assert {_window_key(w): w["n"] for w in windows} == dict(_expected_windows(readings))
    # The first kill landed inside a transaction: its records are on the brokers,
    # aborted. It may have been either sink's, and a batch without rows sends only its
    # marker, so count the outputs and the markers.
    topics = [f"rows-{uid}", f"win-{uid}", *_marker_topics(bootstrap, uid)]
    committed = sum(len(read_topic(bootstrap, t)) for t in topics)
    written = sum(len(read_topic(bootstrap, t, isolation="read_uncommitted")) for t in topics)
    assert written > committed, "no kill left an open transaction behind"


def _marker_topics(bootstrap: str, uid: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    markers = [t for t in topics if t.startswith(f"_spanflow.keo-{uid}.")]
    assert len(markers) == 2, f"the two sinks' marker topics: {markers}"
    return markers


def _prepare(bootstrap: str, uid: str, tmp_path: Path, reader: str) -> Path:
    create_topic(bootstrap, f"in-{uid}", partitions=3)
    create_topic(bootstrap, f"rows-{uid}", partitions=2)
    create_topic(bootstrap, f"win-{uid}", partitions=2)
    produce(bootstrap, f"in-{uid}", _readings(), key="device")
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(uid, bootstrap, reader))
    return pipeline


def test_sigkill_inside_an_open_transaction_loses_and_duplicates_nothing(
    nats_url, kafka, tmp_path, uid
):
    pipeline = _prepare(kafka, uid, tmp_path, reader="python")
    log = _run_killing_in_transactions(pipeline, nats_url, tmp_path, kafka, uid)
    _check_exactly_once(kafka, uid, log)


def test_three_brokers_one_killed_with_the_pipeline_inside_a_transaction(nats_url, tmp_path, uid):
    with LocalKafka(brokers=3, log_dir=tmp_path) as cluster:
        pipeline = _prepare(cluster.bootstrap, uid, tmp_path, reader="spark")
        log = _run_killing_in_transactions(
            pipeline, nats_url, tmp_path, cluster.bootstrap, uid, also_kill=[cluster]
        )
        _check_exactly_once(cluster.bootstrap, uid, log)
