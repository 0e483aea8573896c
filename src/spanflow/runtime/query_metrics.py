"""A query's counters and histograms, folded from Spark's batch progress reports.

Pure: :func:`fold` takes a :class:`QueryMetrics` and one ``StreamingQueryProgress``
(as the dict PySpark gives) and adds that batch to it. The executor calls it for every
batch it has not seen, so nothing is sampled: a batch is counted exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spanflow.protocol.metrics import QueryMetrics


def _ms(took: Mapping[str, Any], *names: str) -> float:
    return sum(float(took.get(n) or 0) for n in names) / 1000.0


def batch_seconds(progress: Mapping[str, Any]) -> float:
    """How long the batch ran, without the wait for the query's start slot (spent in
    ``latestOffset``, see spanflow.spark.stagger)."""
    took = progress.get("durationMs") or {}
    return max(0.0, _ms(took, "triggerExecution") - _ms(took, "latestOffset"))


def checkpoint_seconds(progress: Mapping[str, Any]) -> float:
    """Writing the batch's offsets and commit to the checkpoint, plus committing its
    state stores (RocksDB: flush and upload of the changelog or snapshot)."""
    took = progress.get("durationMs") or {}
    state = sum(float(op.get("commitTimeMs") or 0) for op in _operators(progress)) / 1000.0
    return _ms(took, "walCommit", "commitOffsets") + state


def _operators(progress: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(progress.get("stateOperators") or [])


def fold(metrics: QueryMetrics, progress: Mapping[str, Any]) -> None:
    """Count one batch's progress into ``metrics``."""
    metrics.batches += 1
    metrics.records_in += int(progress.get("numInputRows") or 0)
    took = batch_seconds(progress)
    metrics.batch_seconds.observe(took)
    metrics.last_batch_seconds = took
    metrics.checkpoint_seconds.observe(checkpoint_seconds(progress))
    ops = _operators(progress)
    metrics.state_rows = sum(int(op.get("numRowsTotal") or 0) for op in ops)
    metrics.state_bytes = sum(
        max(
            int(op.get("memoryUsedBytes") or 0),
            int((op.get("customMetrics") or {}).get("rocksdbTotalSSTFileSize") or 0),
        )
        for op in ops
    )
