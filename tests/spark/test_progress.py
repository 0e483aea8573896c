"""Counting batches from Spark's progress reports: each batch once, idle reports never,
durations and checkpoint work into histograms."""

from __future__ import annotations

from typing import Any

from spanflow.protocol.metrics import Histogram, QueryMetrics
from spanflow.spark.query import progress


def batch(n: int, rows: int, took_ms: int = 400, state: bool = False) -> dict[str, Any]:
    progress: dict[str, Any] = {
        "batchId": n,
        "numInputRows": rows,
        "durationMs": {
            "latestOffset": 100,  # the wait for the query's start slot, not work
            "addBatch": took_ms - 150,
            "walCommit": 20,
            "commitOffsets": 30,
            "triggerExecution": took_ms,
        },
    }
    if state:
        progress["stateOperators"] = [
            {"numRowsTotal": 7, "memoryUsedBytes": 1000, "commitTimeMs": 50},
            {"numRowsTotal": 3, "memoryUsedBytes": 10, "commitTimeMs": 0,
             "customMetrics": {"rocksdbTotalSSTFileSize": 4096}},
        ]  # fmt: skip
    return progress


def idle(n: int) -> dict[str, Any]:
    """What an idle query reports every 10 s: the id of the batch it has not run."""
    return {
        "batchId": n,
        "numInputRows": 0,
        "durationMs": {"latestOffset": 3, "triggerExecution": 3},
    }


class Query:
    def __init__(self, *reports: dict[str, Any]) -> None:
        self.recentProgress = list(reports)

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self.recentProgress[-1] if self.recentProgress else None


def test_a_batch_is_counted_once_and_idle_reports_never() -> None:
    q = Query(batch(0, 5), batch(1, 7))
    assert [p["batchId"] for p in progress.batches_since(q, -1)] == [0, 1]  # missed: read them all
    assert progress.batches_since(q, 1) == []  # nothing new
    q.recentProgress.append(idle(2))
    assert progress.batches_since(q, 1) == []  # batch 2 has not run: not seen yet
    q.recentProgress.append(batch(2, 40))
    assert [p["numInputRows"] for p in progress.batches_since(q, 1)] == [40]  # then it counts
    q.recentProgress += [idle(3), batch(3, 1), idle(4)]
    assert [p["batchId"] for p in progress.batches_since(q, 2)] == [3]


def test_folding_counts_records_durations_checkpoints_and_state() -> None:
    m = QueryMetrics()
    progress.fold(m, batch(0, 5, took_ms=400, state=True))
    progress.fold(m, batch(1, 7, took_ms=2100))
    assert (m.batches, m.records_in) == (2, 12)
    assert m.batch_seconds.count == 2 and m.batch_seconds.sum == 0.3 + 2.0
    assert m.last_batch_seconds == 2.0
    # offset log + commit log, plus the state stores' commits in the first batch
    assert m.checkpoint_seconds.sum == (0.05 + 0.05) + 0.05
    assert (m.state_rows, m.state_bytes) == (0, 0)  # the last batch had no state
    progress.fold(m, batch(2, 0, state=True))
    assert (m.state_rows, m.state_bytes) == (10, 1000 + 4096)


def test_histogram_buckets_are_cumulative_for_prometheus() -> None:
    h = Histogram()
    for seconds in (0.001, 0.3, 0.3, 7.0, 1000.0):
        h.observe(seconds)
    buckets = dict(h.cumulative())
    assert buckets["0.005"] == 1 and buckets["0.5"] == 3 and buckets["10.0"] == 4
    assert buckets["60.0"] == 4 and buckets["+Inf"] == 5 == h.count


def _batch(batch_id: int, began: str, took_ms: int, **parts: int) -> dict:
    return {
        "batchId": batch_id,
        "timestamp": f"2026-11-29T{began}Z",
        "numInputRows": 10,
        "durationMs": {"triggerExecution": took_ms, **parts},
    }


def test_a_batch_on_time_after_a_short_pause_is_not_told():
    before = _batch(1, "14:00:00.000", 400, addBatch=300)
    after = _batch(2, "14:00:01.000", 500, addBatch=400)
    assert progress.slow_batch_note(after, trigger=1.0, previous=before) is None


def test_a_long_quiet_before_a_batch_is_told_with_its_length():
    before = _batch(1, "14:00:00.000", 500, addBatch=400)
    after = _batch(2, "14:00:08.500", 600, addBatch=500)
    note = progress.slow_batch_note(after, trigger=1.0, previous=before)
    assert note is not None and "no batch for 8.0 s before it" in note


def test_a_slow_batch_names_its_slowest_part_first():
    slow = _batch(3, "14:00:00.000", 7000, walCommit=500, addBatch=6000, latestOffset=200)
    note = progress.slow_batch_note(slow, trigger=1.0)
    assert note is not None
    assert note.index("addBatch 6.0 s") < note.index("walCommit 0.5 s")
    assert "took 6.8 s" in note  # the wait in latestOffset is the start slot's, not the batch's


def test_the_first_batch_of_a_query_is_always_told():
    quick = _batch(0, "14:00:00.000", 300, addBatch=200)
    assert progress.slow_batch_note(quick, trigger=1.0) is None
    note = progress.slow_batch_note(quick, trigger=1.0, first=True)
    assert note is not None and note.startswith("first batch here 0")
