"""One sink's supervised query: when it restarts after a failure, and what its status
says. The runner (:mod:`spanflow.spark.runner`) keeps one :class:`Supervised` per sink
and asks :func:`status_of` for its figures; nothing here starts or stops a query.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spanflow.spark.connectors import Output
from spanflow.spark.connectors.jetstream import realtime
from spanflow.spark.query import progress

log = logging.getLogger(__name__)

LIVE_RATE_SECONDS = 1.0
"""A real-time query's rates are measured over at least this long."""
HEALTHY_RUN_S = 60.0
"""A query that ran this long before failing starts its restart backoff again at 1 s."""
RESTART_BACKOFF_MAX_S = 30.0


@dataclass
class QueryStatus:
    sink: str
    active: bool
    batches: int = 0
    input_rows_per_s: float = 0.0
    processed_rows_per_s: float = 0.0
    last_batch_ms: int = 0
    lag: int = 0
    watermark: str | None = None
    restarts: int = 0
    error: str | None = None
    realtime: bool = False
    """Runs in Real-Time Mode: its batches last minutes, so there is no batch duration;
    rates and lag come live from the JVM readers' counters instead of batch progress."""
    records: int | None = None
    """A real-time query: records its readers read since it started (live)."""


@dataclass
class Supervised:
    sink_id: str
    query: StreamingQuery | None = None
    restarts: int = 0
    error: str | None = None
    next_restart: float = 0.0
    failing: int = 0
    """Failures since the query last ran for :data:`HEALTHY_RUN_S`: what its backoff
    grows with (a query that failed last week restarts as soon as one that never did)."""
    started_at: float = 0.0
    slot: float | None = None
    """Fraction of the interval this query's batches start at (kept across restarts)."""
    live: realtime.LiveRead | None = None
    """A real-time query's reading its rates are measured from (renewed each second)."""
    live_rates: tuple[float, float] = (0.0, 0.0)
    named: bool = False
    """Whether the query names its sources (its checkpoint keeps offsets by name, so a
    new version may add or drop sources: :mod:`spanflow.spark.checkpoints.source_names`)."""

    def failed(self, exc: BaseException, now: float, *, restarting: bool = False) -> None:
        """The query failed (``restarting``: it could not even start again): note why
        and when to restart it (:func:`restart_backoff`)."""
        self.error = str(exc).split("\n")[0][:300] or type(exc).__name__
        ran_for = 0.0 if restarting else now - self.started_at
        delay, self.failing = restart_backoff(self.failing, ran_for)
        self.next_restart = now + delay
        what = "could not restart" if restarting else "failed"
        log.warning("query %s %s (%s); restarting in %.0f s", self.sink_id, what, self.error, delay)


def restart_delay(failing: int) -> float:
    """Seconds before a query's restart after ``failing`` earlier failures in a row: 1,
    2, 4, … up to :data:`RESTART_BACKOFF_MAX_S`."""
    return min(RESTART_BACKOFF_MAX_S, 2.0 ** min(max(0, failing), 5))


def restart_backoff(failing: int, ran_for_s: float) -> tuple[float, int]:
    """(seconds before restarting a query that just failed, its failures in a row now).

    A query that had run :data:`HEALTHY_RUN_S` before failing counts from scratch: one
    overloaded minute a month ago must not make today's restart wait 30 s."""
    if ran_for_s >= HEALTHY_RUN_S:
        failing = 0
    return restart_delay(failing), failing + 1


@contextlib.contextmanager
def no_data_batches(spark: SparkSession, *, enabled: bool) -> Iterator[None]:
    """Whether the query started in this block runs batches without new data (a query
    takes its own copy of the session's settings when it starts)."""
    if enabled:
        yield
        return
    conf, key = spark.conf, "spark.sql.streaming.noDataMicroBatches.enabled"
    before = conf.get(key, "true") or "true"
    conf.set(key, "false")
    try:
        yield
    finally:
        conf.set(key, before)


def status_of(
    spark: SparkSession, sup: Supervised, is_realtime: bool, outputs: dict[str, Output]
) -> QueryStatus:
    """A sink query's status: from its last batch's progress (micro-batch), or from its
    readers' and writer's live counters (real time, whose batches last minutes)."""
    q = sup.query
    st = QueryStatus(
        sink=sup.sink_id,
        active=bool(q and q.isActive),
        restarts=sup.restarts,
        error=sup.error,
        realtime=is_realtime,
    )
    if q is None:
        return st
    last = q.lastProgress  # one JVM call (recentProgress is one per batch)
    if is_realtime:
        st.batches = int(last["batchId"]) + 1 if last else 0
        _observe_live(spark, sup, q, st, outputs)
    elif last:
        st.batches = int(last["batchId"]) + 1
        st.input_rows_per_s = float(last.get("inputRowsPerSecond") or 0.0)
        st.processed_rows_per_s = float(last.get("processedRowsPerSecond") or 0.0)
        st.last_batch_ms = round(progress.batch_seconds(last) * 1000)
        st.watermark = (last.get("eventTime") or {}).get("watermark")
        st.lag = progress.lag(last)
    return st


def _observe_live(
    spark: SparkSession,
    sup: Supervised,
    q: StreamingQuery,
    st: QueryStatus,
    outputs: dict[str, Output],
) -> None:
    """Rates and lag of a real-time query from its readers' live counters; rates over
    at least a second, so that frequent status calls do not make them noise."""
    try:
        now = realtime.live_read(spark, q.id)
    except Exception as exc:  # the JVM is going away; status must not fail
        log.debug("live progress of %s: %s", sup.sink_id, exc)
        return
    if now is None:
        return
    if sup.live is None or now.records < sup.live.records:
        sup.live = now  # first reading, or the counters were reset
    elif now.at - sup.live.at >= LIVE_RATE_SECONDS:
        sup.live_rates = realtime.rates(sup.live, now)
        sup.live = now
    st.input_rows_per_s, st.processed_rows_per_s = sup.live_rates
    st.lag = now.pending
    st.records = now.records
    _observe_written(spark, sup.sink_id, q, outputs)


def _observe_written(
    spark: SparkSession, sink_id: str, q: StreamingQuery, outputs: dict[str, Output]
) -> None:
    """A real-time JetStream sink's records and their latency, counted by its JVM
    writer while the batch runs, as its output (what micro-batch sinks count here)."""
    try:
        written = realtime.live_written(spark, q.id)
    except Exception as exc:  # the JVM is going away; status must not fail
        log.debug("live output of %s: %s", sink_id, exc)
        return
    if written is not None:
        output = outputs.setdefault(sink_id, Output())
        output.records, output.latency = written
