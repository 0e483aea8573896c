"""Spark's progress reports turned into spanflow's figures, in one place: the executor
counts every batch into a query's metrics (:func:`fold`, :func:`batches_since`), the
runner reads a query's last batch for its status (:func:`batch_seconds`, :func:`lag`).

Pure but for :func:`batches_since`, which reads a query's progress with as few calls
into the JVM as it can; :func:`fold` takes a :class:`QueryMetrics` and one
``StreamingQueryProgress`` (as the dict PySpark gives) and adds that batch to it, so
nothing is sampled: a batch is counted exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from spanflow.protocol.metrics import QueryMetrics


def _ms(took: Mapping[str, Any], *names: str) -> float:
    return sum(float(took.get(n) or 0) for n in names) / 1000.0


def batch_seconds(progress: Mapping[str, Any]) -> float:
    """How long the batch ran, without the wait for the query's start slot (spent in
    ``latestOffset``, see spanflow.spark.query.stagger)."""
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


SLOW_BATCH_SECONDS = 2.0
"""A batch that runs longer than this (or than twice its trigger) is logged with where its
time went: a stall in the output is otherwise a guess between the source, the plan,
the sink and the checkpoint."""

QUIET_SECONDS = 3.0
"""A gap this long between two batches is logged with the batch that ends it: the source
had nothing new (or did not answer) all that time."""

_PARTS = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets")


def slow_batch_note(
    progress: Mapping[str, Any],
    *,
    trigger: float,
    previous: Mapping[str, Any] | None = None,
    first: bool = False,
) -> str | None:
    """One line saying where a slow batch's time went, or ``None`` for a batch on time.

    ``previous``: the query's batch before this one (for the gap between them);
    ``first``: the first batch of a query started here (always told: it is the one a
    moved fragment's recovery waits for).

    >>> slow_batch_note({"batchId": 7, "timestamp": "2026-11-29T14:04:29.100Z",
    ...     "numInputRows": 812, "durationMs": {"triggerExecution": 5800, "addBatch": 4200,
    ...     "queryPlanning": 900, "latestOffset": 20}}, trigger=1.0)
    'batch 7 (began 14:04:29.100) took 5.8 s, 812 rows: addBatch 4.2 s, queryPlanning 0.9 s'
    >>> slow_batch_note({"batchId": 8, "durationMs": {"triggerExecution": 300}}, trigger=1.0)
    """
    took = batch_seconds(progress)
    gap = _gap(previous, progress)
    if not first and took <= max(SLOW_BATCH_SECONDS, 2 * trigger) and gap < QUIET_SECONDS:
        return None
    durations = progress.get("durationMs") or {}
    parts = sorted(((n, _ms(durations, n)) for n in _PARTS), key=lambda p: -p[1])
    shown = ", ".join(f"{n} {s:.1f} s" for n, s in parts if s >= 0.1) or "nothing over 0.1 s"
    began = str(progress.get("timestamp") or "")[11:23]
    line = (
        f"{'first batch here' if first else 'batch'} {progress.get('batchId')} "
        f"(began {began}) took {took:.1f} s, {int(progress.get('numInputRows') or 0)} rows: "
        f"{shown}"
    )
    if gap >= QUIET_SECONDS:
        line += f"; no batch for {gap:.1f} s before it"
    return line


def _gap(previous: Mapping[str, Any] | None, progress: Mapping[str, Any]) -> float:
    """Seconds from the end of ``previous`` to the start of ``progress`` (0 if unknown)."""
    if previous is None:
        return 0.0
    try:
        before = _instant(str(previous["timestamp"]))
        now = _instant(str(progress["timestamp"]))
    except (KeyError, ValueError):
        return 0.0
    ran_for = _ms(previous.get("durationMs") or {}, "triggerExecution")
    return max(0.0, now - before - ran_for)


def _instant(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def lag(progress: Mapping[str, Any]) -> int:
    """Messages the query's sources had but had not read at the end of the batch."""
    lag = 0
    for source in progress.get("sources", []):
        latest, end = source.get("latestOffset"), source.get("endOffset")
        try:
            latest_seq = json.loads(latest)["seq"] if isinstance(latest, str) else latest["seq"]
            end_seq = json.loads(end)["seq"] if isinstance(end, str) else end["seq"]
            lag += max(0, int(latest_seq) - int(end_seq))
        except (TypeError, KeyError, ValueError):
            continue
    return lag


def batches_since(query: Any, seen: int) -> list[dict[str, Any]]:
    """Progress of the batches after ``seen`` that ran, oldest first.

    ``lastProgress`` is one call into the JVM; ``recentProgress`` is one per kept batch
    (up to 100): at a heartbeat a second that is CPU a small edge node needs for its
    queries, so it is read only when batches were missed in between. An idle query
    reports progress too (every 10 s), under the id of the batch it has not run yet:
    such a report is no batch, and counting it would hide the batch that follows.
    """
    last = query.lastProgress
    if last is None or int(last["batchId"]) <= seen:
        return []
    if int(last["batchId"]) == seen + 1:
        return [dict(last)] if ran(last) else []
    return [dict(p) for p in query.recentProgress if int(p["batchId"]) > seen and ran(p)]


def ran(progress: Any) -> bool:
    """Whether a progress report is of a batch that ran (not an idle query's report)."""
    return "addBatch" in (dict(progress).get("durationMs") or {})


def counted_once(reads: Mapping[str, frozenset[str]]) -> list[list[str]]:
    """Groups of queries (by sink) whose reads, together, count each source once.

    ``reads``: the sources each sink's query reads. Every sink of a fragment runs its
    own query over the same sources, so summing their input counts a record once per
    sink. Queries that read the same sources form a group (take its furthest figure);
    a group is counted when its sources are not counted yet, widest first, so a join
    over two sources counts both and a sink of one of them is not counted again.

    >>> counted_once({"alerts": frozenset({"r"}), "anomalies": frozenset({"r"})})
    [['alerts', 'anomalies']]
    >>> counted_once({"a": frozenset({"r"}), "j": frozenset({"r", "t"}), "b": frozenset({"u"})})
    [['j'], ['b']]
    """
    groups: dict[frozenset[str], list[str]] = {}
    for sink, sources in sorted(reads.items()):
        groups.setdefault(sources, []).append(sink)
    covered: set[str] = set()
    chosen = []
    for sources in sorted(groups, key=lambda s: (-len(s), sorted(s))):
        if sources and not sources & covered:
            covered |= sources
            chosen.append(groups[sources])
    return chosen
