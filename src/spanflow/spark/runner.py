"""Run a compiled pipeline on this node: one streaming query per sink, supervised.

The runner creates the streams a pipeline writes to (sinks, dead letters) and, for
sources that declare subjects, the streams it reads. Each sink's query checkpoints
under ``<checkpoint_dir>/<pipeline>/<sink>``; restarting with the same directory
resumes exactly where the last committed batch ended. A query that fails is
restarted from its checkpoint with back-off, so a broker hiccup never ends the
pipeline.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.js.kv import KeyValue
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spanflow.nats.batch_plan import plan_key
from spanflow.nats.fences import Fence, Fenced, check, claim, fences
from spanflow.nats.streams import SyncNats, ensure_source_streams, ensure_stream, stream_usage
from spanflow.protocol.metrics import StreamUsage
from spanflow.security.environment import assignment_verifier
from spanflow.spark import (
    checkpoint_store,
    connectors,
    progress,
    source_names,
    source_starts,
    versions,
)
from spanflow.spark.compile.pipeline import CompiledSink, compile_pipeline
from spanflow.spark.compile.udf import UserFunction
from spanflow.spark.connectors import BatchWriter, Output, RowsCallback, SinkContext
from spanflow.spark.connectors.jetstream import realtime
from spanflow.spark.connectors.jetstream.source import register_isolated
from spanflow.spark.deadletter import DLQ_SUBJECT_PREFIX, EPOCH_PROPERTY, LATE, dlq_subject
from spanflow.spark.stagger import BatchSlots, phase_ms
from spanflow.spark.watermark_beats import SiteBeats
from spanflow.spec import locations
from spanflow.spec.durations import spark_interval
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.retention import DEFAULT_RETENTION, Retention
from spanflow.spec.steps.io import SinkStep
from spanflow.spec.steps.joins import EnrichStep
from spanflow.spec.upgrade import can_name_sources

log = logging.getLogger(__name__)

REALTIME_FENCE_CHECK = 1.0
"""Seconds between fence checks while real-time queries run."""
LIVE_RATE_SECONDS = 1.0
"""A real-time query's rates are measured over at least this long."""


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
class _Supervised:
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
    new version may add or drop sources: :mod:`spanflow.spark.source_names`)."""


HEALTHY_RUN_S = 60.0
"""A query that ran this long before failing starts its restart backoff again at 1 s."""

RESTART_BACKOFF_MAX_S = 30.0


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


def _print_rows(sink: str, batch_id: int, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(f"[{sink}] {row}", flush=True)


class PipelineRunner:
    """Start, watch and stop the Spark queries of one pipeline."""

    def __init__(
        self,
        spark: SparkSession,
        spec: PipelineSpec,
        *,
        nats_url: str,
        checkpoint_dir: str | Path,
        functions: Mapping[str, UserFunction] | None = None,
        on_rows: RowsCallback | None = None,
        console_limit: int = 50,
        plan: PipelineSpec | None = None,
        domain: str | None = None,
        slots: BatchSlots | None = None,
        retention: Retention = DEFAULT_RETENTION,
        fence: Fence | None = None,
        batch_plan: str | None = None,
    ) -> None:
        self.spark = spark
        self.batch_plan = batch_plan
        """Set for a replica of a fragment (hot standby): its queries agree every
        micro-batch's rows with the other replica's under this name
        (:mod:`spanflow.nats.batch_plan`), and run no batch without new data (Spark runs
        those when a trigger finds none, which differs between replicas), so both
        replicas' batches, outputs and message ids are the same."""
        self.fence = fence
        """Write only while this fragment's epoch holds its fence (cluster nodes)."""
        self._fence_verifier = assignment_verifier() if fence and fence.proof else None
        """Locked: tells the coordinators' proofs in fence values from forged ones."""
        self.fenced: str | None = None
        """Why the fence stopped this runner's writes, once it has."""
        self._fences: KeyValue | None = None
        self._next_fence_check = 0.0
        self.retention = retention
        """Limits of the streams this runner creates (the site's, from the topology)."""
        self.streams: list[str] = []
        """The streams it reads and writes, once started."""
        self.sourced: list[str] = []
        """Streams here that copy another site's (revived after a cut by the agent)."""
        self.slots = slots or BatchSlots()
        """Start slots, shared by every runner of a node (:mod:`spanflow.spark.stagger`)."""
        self.spec = spec
        self.plan = plan
        self.domain = domain
        """This node's JetStream domain when its site has its own server."""
        self.nats_url = nats_url
        self.checkpoint_dir = locations.join(checkpoint_dir, spec.instance)
        """A local directory or a Hadoop URL (:mod:`spanflow.spec.locations`)."""
        self.functions = dict(functions or {})
        self.on_rows = on_rows or _print_rows
        self.console_limit = console_limit
        self._queries: dict[str, _Supervised] = {}
        self.writers: dict[str, BatchWriter] = {}
        """sink id → the writer of its micro-batch query (closed when it restarts or the
        runner stops)."""
        self.outputs: dict[str, Output] = {}
        """sink id → what it wrote (the sinks that count; see :class:`Output`)."""
        self._mirrors: list[Any] = []
        """Threads copying postgres: lookup tables into their buckets."""
        self._client: SyncNats | None = None
        self._stopped = False
        self.beats = SiteBeats()
        """Watermark beats of the queries that hand output on to a global fragment."""

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> PipelineRunner:
        """Compile, check and start every sink's query; on any error, nothing is left
        running and the error is raised.

        The real-time sinks go first, all the way to running, and the micro-batch sinks
        are compiled while their first batch runs: the alert path answers ≈1.5 s sooner
        after a restart (the micro-batch compile reads the source through the Python data
        source). A micro-batch sink that fails to compile or to pass its checks stops the
        real-time queries again (alerts they wrote in between stay written, exactly once)."""
        sinks = self.spec.sinks()
        first = [s.id for s in sinks if self._realtime(s.id)]
        rest = [s.id for s in sinks if s.id not in first]
        for sink_id in first + rest:
            self._queries[sink_id] = _Supervised(sink_id)
        try:
            if locations.scheme(self.checkpoint_dir) == locations.JETSTREAM:
                checkpoint_store.configure(  # before the compile reads the offset logs
                    self.spark, self.nats_url, domain=self.domain, replicas=self.retention.replicas
                )
            compiled = self._compile_checked(first or rest, sources=True)
            versions.checked_upgrade(self.spark, self.checkpoint_dir, self.spec)
            self._client = SyncNats(self.nats_url)
            self._ensure_streams()
            self._claim_fence()
            self._start_mirrors()
            if first:
                self._launch_all(compiled)
                compiled = self._compile_checked(rest, sources=False)
            self._launch_all(compiled)
            versions.record_version(self.spark, self.checkpoint_dir, self.spec)
        except BaseException:
            self.stop()
            raise
        return self

    def _compile_checked(self, sink_ids: list[str], *, sources: bool) -> dict[str, CompiledSink]:
        """Compile ``sink_ids`` and check the external systems they (and, with ``sources``,
        the pipeline's sources) use: an unreachable system, a missing topic or table, a
        refused password fails here, not in a restart loop."""
        compiled = {sink_id: self._compile(self._queries[sink_id]) for sink_id in sink_ids}
        connectors.preflight(
            self.spec,
            {k: c.df.schema for k, c in compiled.items()},
            sinks=sink_ids,
            sources=sources,
        )
        return compiled

    def _launch_all(self, compiled: Mapping[str, CompiledSink]) -> None:
        for sink_id, plan in compiled.items():
            self._launch(self._queries[sink_id], plan)

    def _start_mirrors(self) -> None:
        """Mirror each postgres: lookup table into its bucket (a first copy before any
        query runs, so the first records find the table)."""
        from spanflow.spark.connectors.postgres import TableMirror

        for step in self.spec.steps:
            if isinstance(step, EnrichStep) and step.pg_table is not None:
                self._mirrors.append(TableMirror(self.nats_url, step).start())

    def _claim_fence(self) -> None:
        """Hold this fragment's fence before any query runs (raises Fenced if a newer
        epoch holds it: the fragment was moved on)."""
        c, fence = self._client, self.fence
        if fence is None or c is None:
            return
        kv = self._fences_bucket()
        c.run(lambda: claim(kv, fence, self._fence_verifier))

    def _check_fence(self) -> None:
        c, fence, kv = self._client, self.fence, self._fences
        if fence is None or c is None or kv is None:
            return
        try:
            c.run_patiently(
                lambda: check(kv, fence, self._fence_verifier),
                f"{self.spec.instance}: fence check",
                permanent=(Fenced,),
            )
        except Fenced as exc:
            self.fenced = str(exc)
            log.warning("%s: not writing: %s", self.spec.instance, exc)
            raise

    def _watch_realtime_fence(self) -> None:
        """A micro-batch checks the fence before each publish; a real-time batch
        publishes for minutes, so its fence is checked here instead, at most once per
        :data:`REALTIME_FENCE_CHECK` seconds. Fenced, its queries stop before their batch
        commits: what they published since the newer epoch claimed is re-published by
        the new owner from the same checkpoint with the same message ids, and JetStream
        keeps one copy."""
        if self.fence is None or self.fenced or self._stopped:
            return
        live = [
            sup
            for sup in self._queries.values()
            if sup.query is not None and self._realtime(sup.sink_id) and sup.query.isActive
        ]
        now = time.monotonic()
        if not live or now < self._next_fence_check:
            return
        self._next_fence_check = now + REALTIME_FENCE_CHECK
        try:
            self._check_fence()
        except Fenced:
            for sup in live:
                assert sup.query is not None
                with contextlib.suppress(Exception):
                    sup.query.stop()
                sup.error = self.fenced
        except Exception as exc:  # the server is out of reach: keep going, check again
            log.warning("%s: fence not checked: %s", self.spec.instance, exc)

    def _ensure_streams(self) -> None:
        c = self._client
        assert c is not None
        c.run(
            lambda: ensure_stream(
                c.js,
                self.spec.dead_letter_stream,
                [f"{DLQ_SUBJECT_PREFIX}.>"],
                retention=self.retention.model_copy(
                    update={"max_age": self.spec.dead_letter_retention}
                ),
            )
        )
        sources = c.run(lambda: ensure_source_streams(c.js, self.spec, self.domain, self.retention))
        self.streams = [self.spec.dead_letter_stream, *sources]
        self.sourced = [
            s.stream
            for s in self.spec.sources()
            if s.stream and s.source_domain and s.source_domain != self.domain
        ]
        self.streams.extend(s.stream for s in self.spec.sinks() if s.stream)

    def stream_usage(self) -> list[StreamUsage]:
        """How full the streams this pipeline reads and writes are (the dead letters'
        too), against their limits."""
        c = self._client
        if c is None:
            return []
        warn_at = self.retention.warn_at
        found = [
            c.run(lambda n=name: stream_usage(c.js, n, warn_at=warn_at))  # type: ignore[misc]
            for name in dict.fromkeys(self.streams)
        ]
        return [u for u in found if u is not None]

    def _realtime(self, sink_id: str) -> bool:
        return self.spec.mode_of(self._sink(sink_id)) == "realtime"

    def _compile(self, sup: _Supervised) -> CompiledSink:
        """One sink's plan, reading through a data source registered for this query alone
        (and anew on every restart): see :func:`register_isolated`. A real-time sink
        reads through the JVM source instead (JetStream's Real-Time Mode)."""
        if self._realtime(sup.sink_id):
            sup.named = False  # Real-Time Mode keeps its offsets by position
            with source_names.evolution(self.spark, enabled=False):
                plans = compile_pipeline(
                    self.spark,
                    self.spec,
                    nats_url=self.nats_url,
                    functions=self.functions,
                    source_format=realtime.SOURCE_FORMAT,
                    plan=self.plan,
                    realtime=True,
                    sinks=[sup.sink_id],
                )
            return next(c for c in plans if c.sink.id == sup.sink_id)
        token = re.sub(r"[^A-Za-z0-9]", "_", f"{self.spec.instance}_{sup.sink_id}")
        fmt = register_isolated(self.spark, f"spanflow_js_{token}_{sup.restarts}")
        if sup.slot is None:
            sup.slot = self.slots.take()
        interval = self.spec.trigger_of(self._sink(sup.sink_id))
        checkpoint = locations.join(self.checkpoint_dir, sup.sink_id)
        sup.named = can_name_sources(self.spec, sup.sink_id) and source_names.names_sources(
            self.spark, checkpoint
        )
        with source_names.evolution(self.spark, enabled=sup.named):
            plans = compile_pipeline(
                self.spark,
                self.spec,
                nats_url=self.nats_url,
                functions=self.functions,
                source_format=fmt,
                plan=self.plan,
                slot=(phase_ms(sup.slot, interval), round(interval * 1000)),
                sinks=[sup.sink_id],
                batch_plan=plan_key(self.batch_plan, sup.sink_id) if self.batch_plan else None,
                checkpoint=checkpoint,
                named_sources=sup.named,
            )
        return next(c for c in plans if c.sink.id == sup.sink_id)

    def _sink(self, sink_id: str) -> SinkStep:
        return next(s for s in self.spec.sinks() if s.id == sink_id)

    def _set_local_properties(self) -> None:
        """What the next query started on this thread takes to its tasks: its scheduler
        pool, and the fence's epoch its dead letters carry."""
        context = self.spark.sparkContext
        context.setLocalProperty("spark.scheduler.pool", self.spec.instance)
        context.setLocalProperty(EPOCH_PROPERTY, str(self.fence.epoch) if self.fence else "")

    def _start_query(self, sup: _Supervised) -> None:
        self._launch(sup, self._compile(sup))

    def _launch(self, sup: _Supervised, compiled: CompiledSink) -> None:
        sup.started_at = time.monotonic()  # first starts and restarts alike
        sink, df, mode = compiled.sink, compiled.df, compiled.mode
        context = self._sink_context(sup, sink)
        name = f"{self.spec.instance}.{sink.id}"
        self._set_local_properties()
        if self._realtime(sink.id):
            with source_names.evolution(self.spark, enabled=False):
                sup.query = connectors.realtime_start(sink)(context, df, name)
            log.info("started %s in real time, checkpoint %s", name, context.checkpoint)
            return
        batch_writer = connectors.writer(sink)(context, sink.id, sink.options)
        old = self.writers.pop(sink.id, None)
        if old is not None:
            old.close()
        self.writers[sink.id] = batch_writer
        writer = (
            df.writeStream.queryName(name)
            .outputMode(mode)
            .option("checkpointLocation", context.checkpoint)
            .trigger(processingTime=self._trigger_interval(sink))
        )
        source_starts.wait_until_quiet()  # one reader process starting at a time
        with (
            self._no_data_batches(enabled=self.batch_plan is None),
            source_names.evolution(self.spark, enabled=sup.named),
        ):
            sup.query = batch_writer.attach(writer).start()
        source_starts.started(sup.query)
        log.info("started %s (%s mode) checkpoint %s", name, mode, context.checkpoint)

    def _trigger_interval(self, sink: SinkStep) -> str:
        """Spark's trigger for a sink's query. Replicas that agree their batches run
        with a zero trigger: their JetStream source keeps the pace itself (a new batch
        once per interval, at its slot) and runs the batches a peer planned at once, so
        a replica behind its peer catches up instead of replaying at the peer's pace."""
        if self.batch_plan is not None:
            return spark_interval(0)
        return spark_interval(self.spec.trigger_of(sink))

    @contextlib.contextmanager
    def _no_data_batches(self, *, enabled: bool) -> Iterator[None]:
        """Whether the query started here runs batches without new data (a query takes
        its own copy of the session's settings when it starts)."""
        if enabled:
            yield
            return
        conf, key = self.spark.conf, "spark.sql.streaming.noDataMicroBatches.enabled"
        before = conf.get(key, "true") or "true"
        conf.set(key, "false")
        try:
            yield
        finally:
            conf.set(key, before)

    def _sink_context(self, sup: _Supervised, sink: SinkStep) -> SinkContext:
        """What the sink's writer gets from this runner."""
        return SinkContext(
            pipeline=self.spec.instance,
            check_fence=self._check_fence,
            step=sink,
            spark=self.spark,
            nats_url=self.nats_url,
            fence=self.fence,
            fences=self._fences_bucket,
            nats=self._client,
            checkpoint=locations.join(self.checkpoint_dir, sink.id),
            first_start=sup.restarts == 0,
            retention=self.retention,
            output=self.outputs.setdefault(sink.id, Output()),
            show_rows=self.on_rows,
            show_limit=self.console_limit,
            replicated=self.batch_plan is not None,
        )

    def _fences_bucket(self) -> KeyValue:
        c = self._client
        assert c is not None, "start() first"
        if self._fences is None:
            self._fences = c.run(lambda: fences(c.js, self.retention.replicas))
        return self._fences

    def supervise(self) -> None:
        """Restart failed queries from their checkpoints, and stop real-time queries
        whose fence a newer epoch took, and send watermark beats (call periodically)."""
        self._watch_realtime_fence()
        self._beat()
        for sup in self._queries.values():
            q = sup.query
            if self._stopped or q is None or q.isActive:
                continue
            exc = q.exception()
            if exc is None:  # finished on its own (availableNow) or stopped
                continue
            if self.fenced:  # a newer epoch writes now: restarting would only fail again
                sup.error = self.fenced
                continue
            now = time.monotonic()
            if sup.next_restart == 0.0:
                sup.error = str(exc).split("\n")[0][:300]
                delay, sup.failing = restart_backoff(sup.failing, now - sup.started_at)
                sup.next_restart = now + delay
                log.warning("query %s failed (%s); restarting in %.0f s", q.name, sup.error, delay)
            elif now >= sup.next_restart:
                if source_starts.busy():  # another query's reader is starting: next tick
                    continue
                sup.restarts += 1
                sup.next_restart = 0.0
                try:
                    self._start_query(sup)
                except Exception as failed:  # e.g. NATS unreachable: try again later
                    sup.error = str(failed).split("\n")[0][:300] or type(failed).__name__
                    delay, sup.failing = restart_backoff(sup.failing, 0.0)
                    sup.next_restart = time.monotonic() + delay
                    log.warning(
                        "query %s could not restart (%s); again in %.0f s",
                        sup.sink_id,
                        sup.error,
                        delay,
                    )

    def _beat(self) -> None:
        """Tell global fragments how far this one's event time has gone
        (:mod:`spanflow.spark.watermark_beats`)."""
        if self._client is None or self._stopped or self.fenced:
            return
        queries = [
            (self._sink(sup.sink_id), sup.query)
            for sup in self._queries.values()
            if sup.query is not None and not self._realtime(sup.sink_id)
        ]
        self.beats.tick(self._client, queries)

    def stop(self) -> None:
        """Stop every query (idempotent). The last committed batch is kept in the checkpoint."""
        self._stopped = True
        for sup in self._queries.values():
            if sup.query is not None and sup.query.isActive:
                try:
                    sup.query.stop()
                except Exception as exc:
                    log.warning("stopping %s: %s", sup.sink_id, exc)
            if sup.query is not None and self._realtime(sup.sink_id):
                with contextlib.suppress(Exception):
                    realtime.forget_live_read(self.spark, sup.query.id)
        for batch_writer in self.writers.values():
            with contextlib.suppress(Exception):
                batch_writer.close()
        self.writers.clear()
        for mirror in self._mirrors:
            mirror.stop()
        self._mirrors.clear()
        if self._client is not None:
            self._client.close()
            self._client = None

    def await_idle(self) -> None:
        """Block until every query has processed all data available now (tests, CLI)."""
        for sup in self._queries.values():
            if sup.query is not None and not self._realtime(sup.sink_id):
                sup.query.processAllAvailable()  # a real-time query's batch runs for minutes

    # -- observation -----------------------------------------------------------------
    @property
    def queries(self) -> dict[str, StreamingQuery | None]:
        return {k: s.query for k, s in self._queries.items()}

    def status(self) -> list[QueryStatus]:
        out = []
        for sink_id, sup in self._queries.items():
            q = sup.query
            realtime = self._realtime(sink_id)
            st = QueryStatus(
                sink=sink_id,
                active=bool(q and q.isActive),
                restarts=sup.restarts,
                error=sup.error,
                realtime=realtime,
            )
            if q is not None and realtime:
                last = q.lastProgress
                st.batches = int(last["batchId"]) + 1 if last else 0
                self._observe_live(sup, q, st)
            elif q is not None:
                last = q.lastProgress  # one JVM call (recentProgress is one per batch)
                if last:
                    st.batches = int(last["batchId"]) + 1
                    st.input_rows_per_s = float(last.get("inputRowsPerSecond") or 0.0)
                    st.processed_rows_per_s = float(last.get("processedRowsPerSecond") or 0.0)
                    st.last_batch_ms = round(progress.batch_seconds(last) * 1000)
                    st.watermark = (last.get("eventTime") or {}).get("watermark")
                    st.lag = progress.lag(last)
            out.append(st)
        return out

    def _observe_live(self, sup: _Supervised, q: StreamingQuery, st: QueryStatus) -> None:
        """Rates and lag of a real-time query from its readers' live counters; rates over
        at least a second, so that frequent status calls do not make them noise."""
        try:
            now = realtime.live_read(self.spark, q.id)
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
        self._observe_written(sup.sink_id, q)

    def _observe_written(self, sink_id: str, q: StreamingQuery) -> None:
        """A real-time JetStream sink's records and their latency, counted by its JVM
        writer while the batch runs, as its output (what micro-batch sinks count here)."""
        try:
            written = realtime.live_written(self.spark, q.id)
        except Exception as exc:  # the JVM is going away; status must not fail
            log.debug("live output of %s: %s", sink_id, exc)
            return
        if written is not None:
            output = self.outputs.setdefault(sink_id, Output())
            output.records, output.latency = written

    def dead_letters(self) -> int:
        """Messages this pipeline has dead-lettered so far (late records too)."""
        return self._dead_letters_on(dlq_subject(self.spec.instance, ">"))

    def late_records(self) -> int:
        """Late records this pipeline has dead-lettered so far (reason ``late``)."""
        return self._dead_letters_on(dlq_subject(self.spec.instance, "*", LATE))

    def _dead_letters_on(self, subject: str) -> int:
        c = self._client
        if c is None:
            return 0
        try:
            info = c.run(
                lambda: c.js.stream_info(self.spec.dead_letter_stream, subjects_filter=subject)
            )
        except Exception:
            return 0
        return sum((info.state.subjects or {}).values())
