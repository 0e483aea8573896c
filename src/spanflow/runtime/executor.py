"""Run a node's fragments: one :class:`PipelineRunner` per fragment, in one SparkSession.

The executor knows nothing of the coordinator: the agent tells it what to run and
asks it what is happening. Savepoints are copies of a stopped fragment's checkpoint;
restoring one copies it back before the fragment starts. Both are locations
(:mod:`spanflow.spec.locations`): with ``jetstream://`` the copy stays inside the site's
NATS, and the node that restores reads what another node wrote.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spanflow.nats.fences import Fence
from spanflow.protocol.metrics import FragmentRuntime, QueryMetrics
from spanflow.spark.checkpoints import checkpoint_store
from spanflow.spark.checkpoints.peer_checkpoint import catch_up_from_peer
from spanflow.spark.query import progress as spark_progress
from spanflow.spark.query.stagger import BatchSlots
from spanflow.spark.query.supervised import QueryStatus
from spanflow.spark.runner import PipelineRunner
from spanflow.spark.session import SparkSession
from spanflow.spec import locations
from spanflow.spec.cluster import Assignment
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.retention import DEFAULT_RETENTION, Retention
from spanflow.spec.steps.io import SourceStep

log = logging.getLogger(__name__)

DEAD_LETTER_POLL = 5.0


@dataclass
class RunningFragment:
    assignment: Assignment
    runner: PipelineRunner
    started_at: float = field(default_factory=time.time)
    last_batch: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, QueryMetrics] = field(default_factory=dict)
    """sink → its query's counters and histograms since the fragment started here."""
    dead_letters: int = 0
    late_records: int = 0
    dead_letters_at: float = 0.0
    offsets: dict[str, Any] = field(default_factory=dict)
    last_progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    """sink → its query's last batch seen (for the gap before the next one)."""


class FragmentExecutor:
    def __init__(
        self,
        spark: SparkSession,
        nats_url: str,
        *,
        domain: str | None = None,
        batch_offset: float = 0.0,
        retention: Retention = DEFAULT_RETENTION,
        node: str | None = None,
        proofs: Mapping[tuple[str, int], bytes] | None = None,
    ) -> None:
        self.spark = spark
        self.node = node
        """This node's name: its fragments write under their assignment's fence."""
        self.proofs = proofs or {}
        """(fragment id, epoch) → its signed assignment (locked): the fences' proofs."""
        self.nats_url = nats_url
        self.domain = domain
        self.retention = retention
        self.slots = BatchSlots(batch_offset)
        """One node's queries take their start slots in turn, whatever fragment they
        belong to (:mod:`spanflow.spark.query.stagger`)."""
        self.fragments: dict[str, RunningFragment] = {}

    def start(self, assignment: Assignment) -> RunningFragment:
        """Start a fragment from its checkpoint (or a savepoint). Raises if it cannot compile."""
        fid = assignment.fragment.id
        began = time.monotonic()
        log.info("fragment %s (epoch %d) starting", fid, assignment.epoch)
        if fid in self.fragments:
            self.stop(fid)
        checkpoint = assignment.checkpoint_dir
        if assignment.restore_from:
            source = assignment.restore_from
            self._prepare_store(checkpoint, source)
            if not checkpoint_store.copy(self.spark, source, checkpoint):
                raise FileNotFoundError(f"savepoint {source} does not exist on this node")
            log.info("fragment %s restored from savepoint %s", fid, source)
        else:
            self._catch_up_from_peers(assignment)
        runner = PipelineRunner(
            self.spark,
            assignment.fragment.spec,
            nats_url=self.nats_url,
            checkpoint_dir=checkpoint,
            on_rows=lambda sink, batch, rows: log.info("[%s/%s] %d rows", fid, sink, len(rows)),
            plan=assignment.fragment.plan,
            domain=self.domain,
            slots=self.slots,
            retention=self.retention,
            batch_plan=assignment.batch_plan,
            fence=(
                Fence(
                    fid,
                    assignment.epoch,
                    self.node,
                    assignment.checkpoint_dir,
                    self.proofs.get((fid, assignment.epoch)),
                )
                if self.node
                else None
            ),
        )
        try:
            runner.start()
        except BaseException:
            runner.stop()
            raise
        running = RunningFragment(assignment, runner)
        self.fragments[fid] = running
        log.info(
            "fragment %s (epoch %d) started in %.1f s",
            fid,
            assignment.epoch,
            time.monotonic() - began,
        )
        return running

    def _catch_up_from_peers(self, assignment: Assignment) -> None:
        """Hot standby: a replica far behind its peer starts from the peer's checkpoint
        (:mod:`spanflow.spark.checkpoints.peer_checkpoint`); a failed copy leaves its own."""
        for peer in assignment.peer_checkpoints:
            self._prepare_store(assignment.checkpoint_dir, peer)
            try:
                if catch_up_from_peer(self.spark, assignment.checkpoint_dir, peer):
                    return
            except Exception as exc:  # a peer's store out of reach: replay instead
                log.warning("fragment %s: peer checkpoint %s unusable: %s",
                            assignment.fragment.id, peer, exc)  # fmt: skip

    def stop(self, fragment_id: str) -> None:
        running = self.fragments.pop(fragment_id, None)
        if running is not None:
            running.runner.stop()
            log.info("fragment %s stopped", fragment_id)

    def savepoint(self, assignment: Assignment) -> str:
        """Stop the fragment (its checkpoint is then consistent) and copy the checkpoint."""
        assert assignment.savepoint_dir is not None
        self.stop(assignment.fragment.id)
        target = assignment.savepoint_dir
        self._prepare_store(assignment.checkpoint_dir, target)
        if not checkpoint_store.copy(self.spark, assignment.checkpoint_dir, target):
            checkpoint_store.make_empty(self.spark, target)  # nothing checkpointed yet
        return target

    def _prepare_store(self, *where: str) -> None:
        """Point ``jetstream://`` at this node's site server before a copy uses it."""
        if any(locations.scheme(w) == locations.JETSTREAM for w in where):
            checkpoint_store.configure(
                self.spark, self.nats_url, domain=self.domain, replicas=self.retention.replicas
            )

    def stop_all(self) -> None:
        for fid in list(self.fragments):
            self.stop(fid)

    def supervise(self) -> None:
        for running in self.fragments.values():
            running.runner.supervise()

    def runtime(self, fragment_id: str) -> FragmentRuntime:
        running = self.fragments[fragment_id]
        runner = running.runner
        statuses = runner.status()
        queries: dict[str, str] = {}
        batches = 0
        for sink, q in runner.queries.items():
            if q is None:
                continue
            queries[sink] = str(q.runId)
            metrics = running.metrics.setdefault(sink, QueryMetrics())
            for progress in spark_progress.batches_since(q, running.last_batch.get(sink, -1)):
                spark_progress.fold(metrics, progress)
                self._tell_slow(running, sink, progress)
                running.last_batch[sink] = int(progress["batchId"])
                ends = [s.get("endOffset") for s in progress.get("sources", [])]
                running.offsets[sink] = [_offset(e) for e in ends]
        for st in statuses:
            batches = max(batches, st.batches)
        now = time.monotonic()
        if now - running.dead_letters_at > DEAD_LETTER_POLL:
            running.dead_letters = runner.dead_letters()
            running.late_records = runner.late_records()
            running.dead_letters_at = now
        failing = [st for st in statuses if not st.active]
        self._complete_metrics(running, statuses)
        once = _CountedOnce(running.runner.spec, statuses, running.metrics)
        return FragmentRuntime(
            fragment_id=fragment_id,
            epoch=running.assignment.epoch,
            status="fenced" if runner.fenced else ("failing" if failing else "running"),
            started_at=running.started_at,
            queries=queries,
            batches=batches,
            rows_in=round(once.total(once.records)),
            source_rows_in=round(once.total(once.records, own_sources=True)),
            input_rows_per_s=once.total(once.rates),
            source_rows_per_s=once.total(once.rates, own_sources=True),
            processed_rows_per_s=sum(st.processed_rows_per_s for st in statuses if not st.realtime),
            realtime_rows_per_s=sum(st.processed_rows_per_s for st in statuses if st.realtime),
            last_batch_ms=max((st.last_batch_ms for st in statuses), default=0),
            lag=round(once.total({st.sink: st.lag for st in statuses})),
            watermark=max((st.watermark for st in statuses if st.watermark), default=None),
            restarts=sum(st.restarts for st in statuses),
            dead_letters=running.dead_letters,
            late_records=running.late_records,
            offsets=dict(running.offsets),
            error=runner.fenced or next((st.error for st in failing if st.error), None),
            metrics={k: m.model_copy(deep=True) for k, m in running.metrics.items()},
        )

    def _tell_slow(self, running: RunningFragment, sink: str, progress: dict[str, Any]) -> None:
        """Log a batch that ran long or ended a long quiet, with where its time went, and
        the first batch of every query started here (a moved fragment's recovery)."""
        spec = running.runner.spec
        step = next((s for s in spec.sinks() if s.id == sink), None)
        note = spark_progress.slow_batch_note(
            progress,
            trigger=spec.trigger if step is None else spec.trigger_of(step),
            previous=running.last_progress.get(sink),
            first=sink not in running.last_progress,
        )
        running.last_progress[sink] = progress
        if note:
            log.info("%s %s: %s", running.assignment.fragment.id, sink, note)

    def _complete_metrics(self, running: RunningFragment, statuses: list[QueryStatus]) -> None:
        """What batch progress does not tell: records written (the runner counts them),
        real-time queries' live counts, each query's trigger interval."""
        runner, spec = running.runner, running.runner.spec
        sinks = {s.id: s for s in spec.sinks()}
        for st in statuses:
            m = running.metrics.setdefault(st.sink, QueryMetrics())
            m.realtime = st.realtime
            if st.realtime and st.records is not None:
                m.records_in = st.records
            if st.sink in sinks:
                m.trigger_seconds = spec.trigger_of(sinks[st.sink])
            output = runner.outputs.get(st.sink)
            if output is not None:
                m.records_out = output.records
                m.latency_seconds = output.latency.model_copy(deep=True)


def _offset(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class _CountedOnce:
    """A fragment's figures with each input record counted once: its sinks' queries
    all read their sources, so per-query figures are summed per group of queries that
    read the same sources (:func:`spanflow.spark.query.progress.counted_once`), taking the
    group's furthest query."""

    def __init__(
        self, spec: PipelineSpec, statuses: list[QueryStatus], metrics: dict[str, QueryMetrics]
    ) -> None:
        reads = {
            st.sink: frozenset(s.id for s in spec.path_to(st.sink) if isinstance(s, SourceStep))
            for st in statuses
            if st.sink in {k.id for k in spec.sinks()}
        }
        self.groups = spark_progress.counted_once(reads)
        hops = {s.id for s in spec.sources() if s.schema_of is not None}
        self.own = [g for g in self.groups if not reads[g[0]] & hops]
        self.records = {k: float(m.records_in) for k, m in metrics.items()}
        self.rates = {
            st.sink: st.processed_rows_per_s if st.realtime else st.input_rows_per_s
            for st in statuses
        }

    def total(self, per_query: dict[str, float], own_sources: bool = False) -> float:
        """Sum over the groups (of those reading the pipeline's own sources only, not
        another fragment's output, when ``own_sources``) of the group's largest value."""
        groups = self.own if own_sources else self.groups
        return sum(max(per_query.get(s, 0.0) for s in g) for g in groups)
