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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spanflow.nats.batch_plan import plan_key
from spanflow.nats.fences import Fence
from spanflow.nats.streams import SyncNats
from spanflow.protocol.metrics import StreamUsage
from spanflow.spark import connectors
from spanflow.spark.checkpoints import source_names, versions
from spanflow.spark.compile.pipeline import CompiledSink, compile_pipeline
from spanflow.spark.compile.udf import UserFunction
from spanflow.spark.connectors import BatchWriter, Output, RowsCallback, SinkContext, lifecycle
from spanflow.spark.connectors.lifecycle import Provisioned
from spanflow.spark.deadletter import EPOCH_PROPERTY, LATE, dlq_subject
from spanflow.spark.query import source_starts
from spanflow.spark.query.fencing import RunnerFence
from spanflow.spark.query.stagger import BatchSlots, phase_ms
from spanflow.spark.query.supervised import (
    QueryStatus,
    Supervised,
    no_data_batches,
    status_of,
)
from spanflow.spark.query.watermark_beats import SiteBeats
from spanflow.spec import locations
from spanflow.spec.durations import spark_interval
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.retention import DEFAULT_RETENTION, Retention
from spanflow.spec.steps.io import SinkStep
from spanflow.spec.upgrade import can_name_sources

log = logging.getLogger(__name__)


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
        self._fence = RunnerFence(
            fence, pipeline=spec.instance, replicas=retention.replicas, client=lambda: self._client
        )
        self.retention = retention
        """Limits of the streams this runner creates (the site's, from the topology)."""
        self.provisioned = Provisioned()
        """The streams it reads and writes and the mirrors it runs, once started."""
        self.slots = slots or BatchSlots()
        """Start slots, shared by every runner of a node (:mod:`spanflow.spark.query.stagger`)."""
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
        self._queries: dict[str, Supervised] = {}
        self.writers: dict[str, BatchWriter] = {}
        """sink id → the writer of its micro-batch query (closed when it restarts or the
        runner stops)."""
        self.outputs: dict[str, Output] = {}
        """sink id → what it wrote (the sinks that count; see :class:`Output`)."""
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
            self._queries[sink_id] = Supervised(sink_id)
        try:
            lifecycle.prepare_checkpoints(  # before the compile reads the offset logs
                self.spark, self.checkpoint_dir, self.nats_url, self.domain, self.retention
            )
            compiled = self._compile_checked(first or rest, sources=True)
            versions.checked_upgrade(self.spark, self.checkpoint_dir, self.spec)
            self._client = SyncNats(self.nats_url)
            self.provisioned = lifecycle.provision(
                self._client,
                self.spec,
                nats_url=self.nats_url,
                domain=self.domain,
                retention=self.retention,
            )
            self._fence.claim()
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

    def stream_usage(self) -> list[StreamUsage]:
        """How full the streams this pipeline reads and writes are (the dead letters'
        too), against their limits."""
        return self.provisioned.usage(self._client, self.retention.warn_at)

    def _realtime(self, sink_id: str) -> bool:
        return self.spec.mode_of(self._sink(sink_id)) == "realtime"

    def _compile(self, sup: Supervised) -> CompiledSink:
        """One sink's plan, reading through a data source registered for this query alone
        (and anew on every restart: ``lifecycle.isolated_source``). A real-time sink
        reads through the JVM source instead (JetStream's Real-Time Mode)."""
        if self._realtime(sup.sink_id):
            sup.named = False  # Real-Time Mode keeps its offsets by position
            with source_names.evolution(self.spark, enabled=False):
                plans = compile_pipeline(
                    self.spark,
                    self.spec,
                    nats_url=self.nats_url,
                    functions=self.functions,
                    source_format=lifecycle.REALTIME_SOURCE_FORMAT,
                    plan=self.plan,
                    realtime=True,
                    sinks=[sup.sink_id],
                )
            return next(c for c in plans if c.sink.id == sup.sink_id)
        token = re.sub(r"[^A-Za-z0-9]", "_", f"{self.spec.instance}_{sup.sink_id}")
        fmt = lifecycle.isolated_source(self.spark, f"spanflow_js_{token}_{sup.restarts}")
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

    def _start_query(self, sup: Supervised) -> None:
        self._launch(sup, self._compile(sup))

    def _launch(self, sup: Supervised, compiled: CompiledSink) -> None:
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
            no_data_batches(self.spark, enabled=self.batch_plan is None),
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

    def _sink_context(self, sup: Supervised, sink: SinkStep) -> SinkContext:
        """What the sink's writer gets from this runner."""
        return SinkContext(
            pipeline=self.spec.instance,
            check_fence=self._fence.check,
            step=sink,
            spark=self.spark,
            nats_url=self.nats_url,
            fence=self.fence,
            fences=self._fence.bucket,
            nats=self._client,
            checkpoint=locations.join(self.checkpoint_dir, sink.id),
            first_start=sup.restarts == 0,
            retention=self.retention,
            output=self.outputs.setdefault(sink.id, Output()),
            show_rows=self.on_rows,
            show_limit=self.console_limit,
            replicated=self.batch_plan is not None,
        )

    def supervise(self) -> None:
        """Restart failed queries from their checkpoints, and stop real-time queries
        whose fence a newer epoch took, and send watermark beats (call periodically)."""
        if not self._stopped:
            self._fence.watch_realtime(
                sup
                for sup in self._queries.values()
                if sup.query is not None and self._realtime(sup.sink_id) and sup.query.isActive
            )
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
                sup.failed(exc, now)
            elif now >= sup.next_restart and not source_starts.busy():  # one reader at a time
                sup.restarts += 1
                sup.next_restart = 0.0
                try:
                    self._start_query(sup)
                except Exception as failed:  # e.g. NATS unreachable: try again later
                    sup.failed(failed, time.monotonic(), restarting=True)

    def _beat(self) -> None:
        """Tell global fragments how far this one's event time has gone
        (:mod:`spanflow.spark.query.watermark_beats`)."""
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
                lifecycle.forget_realtime(self.spark, sup.query.id)
        for batch_writer in self.writers.values():
            with contextlib.suppress(Exception):
                batch_writer.close()
        self.writers.clear()
        self.provisioned.stop()
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
    def fenced(self) -> str | None:
        """Why the fence stopped this runner's writes, once it has."""
        return self._fence.fenced

    @property
    def queries(self) -> dict[str, StreamingQuery | None]:
        return {k: s.query for k, s in self._queries.items()}

    def status(self) -> list[QueryStatus]:
        return [
            status_of(self.spark, sup, self._realtime(sink_id), self.outputs)
            for sink_id, sup in self._queries.items()
        ]

    def dead_letters(self) -> int:
        """Messages this pipeline has dead-lettered so far (late records too)."""
        return self.provisioned.dead_letters(self._client, dlq_subject(self.spec.instance, ">"))

    def late_records(self) -> int:
        """Late records this pipeline has dead-lettered so far (reason ``late``)."""
        late = dlq_subject(self.spec.instance, "*", LATE)
        return self.provisioned.dead_letters(self._client, late)
