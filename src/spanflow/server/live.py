"""The dashboard's live data: recent samples of every fragment, and the event stream.

:class:`History` keeps the last few minutes of each fragment's figures (what its agent
reports), so a chart opened now starts with a past, not an empty axis. The stream
(server-sent events) pushes a :class:`~spanflow.protocol.rest.Snapshot` every interval
and each new control-log record as it is applied, so the page never polls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from spanflow.control import records
from spanflow.protocol.metrics import LATENCY_BUCKETS, FragmentRuntime
from spanflow.protocol.rest import FragmentSample, LogEntry, Snapshot
from spanflow.server.concerns import concerns
from spanflow.server.feed import EventFeed

if TYPE_CHECKING:
    from spanflow.control.coordinator import Coordinator

log = logging.getLogger(__name__)

SAMPLE_INTERVAL = 2.0
"""Seconds between two samples of a fragment."""
KEPT = 300
"""Samples kept per fragment: ten minutes at the default interval."""


def quantile(q: float, counts: list[int]) -> float | None:
    """The ``q`` quantile of observations counted into :data:`LATENCY_BUCKETS` (the
    last count: above them), interpolated inside its bucket as Prometheus's
    ``histogram_quantile`` does; None without observations."""
    total = sum(counts)
    if total == 0:
        return None
    rank, below = q * total, 0
    for i, n in enumerate(counts):
        if n and below + n >= rank:
            if i == len(LATENCY_BUCKETS):
                return LATENCY_BUCKETS[-1]  # above every bound: the highest one
            lower = LATENCY_BUCKETS[i - 1] if i else 0.0
            return lower + (LATENCY_BUCKETS[i] - lower) * (rank - below) / n
        below += n
    return LATENCY_BUCKETS[-1]


def latency_counts(rt: FragmentRuntime) -> list[int]:
    """The fragment's end-to-end latency histogram, its queries together."""
    merged = [0] * (len(LATENCY_BUCKETS) + 1)
    for m in rt.metrics.values():
        merged = [a + b for a, b in zip(merged, m.latency_seconds.counts, strict=True)]
    return merged


def sample_of(rt: FragmentRuntime, at: float, before: list[int] | None = None) -> FragmentSample:
    """``before``: the latency histogram at the previous sample (percentiles are of the
    records in between; a restarted fragment's histogram starts again)."""
    now = latency_counts(rt)
    recent = now
    if before is not None and all(a >= b for a, b in zip(now, before, strict=True)):
        recent = [a - b for a, b in zip(now, before, strict=True)]
    return FragmentSample(
        at=at,
        input_rows_per_s=rt.input_rows_per_s,
        processed_rows_per_s=rt.processed_rows_per_s,
        last_batch_ms=rt.last_batch_ms,
        lag=rt.lag,
        dead_letters=rt.dead_letters,
        late_records=rt.late_records,
        rows_in=rt.rows_in,
        restarts=rt.restarts,
        latency_p50_s=quantile(0.5, recent),
        latency_p99_s=quantile(0.99, recent),
        state_rows=sum(m.state_rows for m in rt.metrics.values()),
        state_bytes=sum(m.state_bytes for m in rt.metrics.values()),
    )


class History:
    """The last :data:`KEPT` samples of each fragment; fragments no longer reported are
    dropped (a cancelled pipeline's charts go with it), fragments that cannot be reached
    get no new samples (their charts stop where their node went silent instead of
    drawing its last figures as a flat line)."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self.samples: dict[str, deque[FragmentSample]] = {}
        self._latency: dict[str, list[int]] = {}

    def record(
        self, runtimes: dict[str, FragmentRuntime], at: float, known: Iterable[str] | None = None
    ) -> None:
        """``runtimes``: the live figures to sample; ``known``: the fragments whose
        samples are kept (default: those of ``runtimes``)."""
        kept = set(runtimes) | set(known or ())
        for fid in set(self.samples) - kept:
            del self.samples[fid]
            self._latency.pop(fid, None)
        for fid, rt in runtimes.items():
            sample = sample_of(rt, at, self._latency.get(fid))
            self._latency[fid] = latency_counts(rt)
            self.samples.setdefault(fid, deque(maxlen=self.kept)).append(sample)

    def of(self, fragments: Iterable[str]) -> dict[str, list[FragmentSample]]:
        return {f: list(self.samples.get(f, ())) for f in fragments}

    def latest(self) -> dict[str, FragmentSample]:
        return {f: s[-1] for f, s in self.samples.items() if s}


async def sample_forever(
    coordinator: Coordinator,
    history: History,
    feed: EventFeed,
    interval: float = SAMPLE_INTERVAL,
) -> None:
    """Sample fragments into ``history`` and keep ``feed`` subscribed to the running
    pipelines' event sinks, every ``interval`` seconds."""
    while True:
        history.record(coordinator.view.live_runtimes(), time.time(), coordinator.observed.runtime)
        if coordinator.nc is not None and coordinator.nc.is_connected:
            try:
                await feed.sync(coordinator.nc, list(coordinator.state.pipelines.values()))
            except Exception:  # a view: never let it stop the sampling
                log.exception("event feed: subscribing failed; again in %.0f s", interval)
        await asyncio.sleep(interval)


def snapshot(coordinator: Coordinator, history: History) -> Snapshot:
    now = time.time()
    nodes, pipelines = coordinator.view.node_statuses(), coordinator.view.pipeline_statuses()
    return Snapshot(
        at=now,
        cluster=coordinator.view.cluster_metrics(),
        nodes=nodes,
        pipelines=pipelines,
        samples=history.latest(),
        concerns=concerns(nodes, pipelines, history.samples, now),
    )


def log_entry(seq: int, record: records.Record) -> LogEntry:
    """A control-log record as the API shows it (``/log`` and the live stream)."""
    return LogEntry(
        seq=seq, kind=record.kind, at=record.at, epoch=record.epoch, detail=records.summary(record)
    )


def event(kind: str, data: str) -> str:
    """One server-sent event (``data`` is one line of JSON)."""
    return f"event: {kind}\ndata: {data}\n\n"


async def stream(
    coordinator: Coordinator,
    history: History,
    feed: EventFeed,
    interval: float,
    disconnected: Callable[[], Awaitable[bool]],
    after: int = 0,
    after_event: int = 0,
) -> AsyncIterator[str]:
    """Snapshots every ``interval`` seconds, every control-log record after ``after``,
    every feed event after ``after_event`` and each incident those events changed, as
    server-sent events, until the client goes away."""
    seq, event_seq = after, after_event
    while not await disconnected():
        yield event("snapshot", snapshot(coordinator, history).model_dump_json())
        now, before = time.time(), event_seq
        for e in feed.after(event_seq):
            yield event("data", e.model_dump_json())
            event_seq = e.seq
        for i in feed.incidents.changed_after(before):
            yield event("incident", feed.incidents.shown(i, now).model_dump_json())
        if coordinator.control_log is not None and coordinator.state.applied > seq:
            for s, r in await coordinator.control_log.history(after=seq, limit=200):
                yield event("log", log_entry(s, r).model_dump_json())
                seq = max(seq, s)
        await asyncio.sleep(interval)
