"""JetStream as a Spark Structured Streaming source (Python data source API).

Source (``spark.readStream.format("spanflow_jetstream")``)
    Offsets are ``{"seq": N}``: the next stream sequence to read (exclusive end of the
    previous batch), plus ``"beat"`` for sources with event time (see
    :meth:`JetStreamReader._heartbeat`). ``latestOffset`` honours admission control
    (``max_rows``) and ``Trigger.AvailableNow``. ``read`` replays an exact sequence range, so an
    uncommitted batch re-runs on identical data after a crash. ``commit(end)`` moves a
    durable consumer's ack floor to ``end`` (consumer reset, nats-server ≥ 2.14): its
    ``num_pending`` is the pipeline's lag, and interest/work-queue retention can
    release what every pipeline has committed. Malformed messages are dead-lettered
    from ``read`` and never reach the query.

The sinks are the JVM's: :mod:`spanflow.spark.connectors.jetstream.sink` (micro-batch) and
:mod:`spanflow.spark.connectors.jetstream.realtime` (Real-Time Mode).

Where each hook runs: ``initialOffset``, ``latestOffset`` and ``commit`` on the
driver; ``read`` on executors. Options are plain strings; nothing here is pickled
except the option dict itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
from nats.aio.client import Client
from nats.js.errors import NotFoundError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spanflow.nats.batch_plan import BatchPlan, plan_key
from spanflow.nats.fastread import read_range_fast
from spanflow.nats.ranges import last_before
from spanflow.nats.streams import SyncNats, connect, through_elections, unanswered
from spanflow.protocol.raw import RawRecord
from spanflow.spark.connectors import reads
from spanflow.spark.deadletter import LATE, DeadLetter, publish_dead_letters
from spanflow.spark.formats import AvroReader, Decoder, ProtobufReader
from spanflow.spark.jvm import worker_logs
from spanflow.spark.late_records import late_reason, late_rows, late_watermark_us
from spanflow.spark.query.stagger import SlotPacer, wait_for_slot
from spanflow.spark.query.watermark_beats import beat_time, is_beat
from spanflow.spec.lateness import LateRule
from spanflow.spec.schema import StreamFormat

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from spanflow.spark.connectors import SourceContext
    from spanflow.spec.steps.io import SourceStep

log = logging.getLogger(__name__)

FORMAT_NAME = "spanflow_jetstream"
BATCH_ROWS = 65_536
STATE_TIMEOUT = 1.0
"""Seconds a stream's info may take before the source reads it as "nothing new yet"."""
FIRST_STATE_TIMEOUT = 5.0
"""The same for the query's first look, which has no earlier answer to fall back on."""
STATE_TOLERANCE = 30.0
"""Seconds a stream may stay silent before its query fails (and its runner restarts it):
longer than any leader election, short enough that a lost stream is reported."""


class JetStreamDataSource(DataSource):
    """Options: see :func:`source_options`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return self.options["ddl"]

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return JetStreamReader(dict(self.options))


def register_isolated(spark: Any, name: str) -> str:
    """Register the JetStream data source under its own name for one query.

    Every registration gets its own JVM-side Python function and environment map.
    Sharing one registration between concurrently starting queries corrupted that map
    (tasks then failed with ``java.io.OptionalDataException`` on every retry) after a
    crash-restart; a query of its own — and a fresh one on each restart — avoids it.
    """
    cls = type(
        f"JetStreamDataSource_{name}", (JetStreamDataSource,), {"name": classmethod(lambda c: name)}
    )
    spark.dataSource.register(cls)
    return name


@reads("jetstream")
def read_stream(ctx: SourceContext, step: SourceStep) -> DataFrame:
    """The JetStream reader: the stream through the data source registered for this
    query (``ctx.data_source``; the JVM's in Real-Time Mode), which reads the options
    of :func:`source_options`."""
    return (
        ctx.reader()
        .format(ctx.data_source)
        .options(**source_options(ctx, step))
        .option("phase_ms", str(ctx.slot[0]))
        .option("interval_ms", str(ctx.slot[1]))
        .option("heartbeat", step.event_time or "")
        .load()
    )


def source_options(ctx: SourceContext, step: SourceStep) -> dict[str, str]:
    """The data source's options for one source step, every one given (plain strings):
    the readers, Python and JVM alike, default nothing (docs/architecture.md,
    "a connector's options")."""
    return {
        "url": ctx.nats_url,
        "stream": step.stream_name,
        "pipeline": ctx.pipeline,
        "step": step.id,
        "batch_plan": ctx.batch_plan or "",
        "format": step.format.value,
        "schema": json.dumps(ctx.schema),
        "ddl": ctx.ddl,
        "filter_subjects": json.dumps(list(step.filter_subjects)),
        "max_rows": str(step.max_rows_per_batch),
        "partitions": str(step.partitions),
        "start": step.start,
        "csv_delimiter": step.csv_delimiter,
        "scalar_field": step.scalar_field or "",
        "avro_schema": json.dumps(step.avro_schema) if step.avro_schema else "",
        "avro_framing": step.avro_framing,
        "protobuf": step.protobuf.model_dump_json() if step.protobuf else "",
        "checkpoint": ctx.checkpoint or "",
        "late_rules": json.dumps([r.to_json() for r in ctx.late_rules]),
        "passive": "true" if ctx.passive else "false",
    }


@dataclass
class SeqRange(InputPartition):
    start: int
    end: int
    heartbeat: bool = False
    """Read the record before ``start`` again, marked ``_heartbeat`` (see
    :meth:`JetStreamReader._heartbeat`)."""
    late_before_us: int | None = None
    """The watermark Spark drops late records by in this batch (µs), None: unknown or
    nothing to drop (:mod:`spanflow.spark.late_records`)."""


class Silence:
    """Since when a stream (or the bucket of its batch plan) has not answered.

    A NATS server's death leaves the streams it led without a leader for an election
    (4 to 9 s). The source reads that silence as "nothing new yet" rather than failing
    its query (a restart costs seconds more than the election), for up to
    :data:`STATE_TOLERANCE` seconds; past that the error goes to Spark and the runner
    restarts the query as for any failure."""

    def __init__(self, what: str, tolerance: float = STATE_TOLERANCE) -> None:
        self.what = what
        self.tolerance = tolerance
        self.since: float | None = None

    def tolerate(self, exc: Exception, now: float | None = None) -> None:
        """Note one unanswered call; raises ``exc`` once the silence lasts too long."""
        now = time.monotonic() if now is None else now
        if self.since is None:
            self.since = now
            log.warning(
                "%s does not answer (%s); no new batch until it does (a leader election "
                "takes 4 to 9 s)",
                self.what,
                type(exc).__name__,
            )
        if now - self.since > self.tolerance:
            raise exc

    def answered(self) -> None:
        if self.since is not None:
            log.info("%s answers again after %.1f s", self.what, time.monotonic() - self.since)
            self.since = None


class JetStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        worker_logs.ensure()
        self.url = options["url"]
        self.stream = options["stream"]
        self.pipeline = options["pipeline"]
        self.step = options["step"]
        self.consumer = options.get("consumer") or f"spanflow-{self.pipeline}-{self.step}"
        self.start_at = options["start"]
        self.max_rows = int(options["max_rows"])
        self.partitions_per_batch = int(options["partitions"])
        self.format = StreamFormat(options["format"])
        self.schema_fields: dict[str, str] = json.loads(options["schema"])
        self.csv_delimiter = options["csv_delimiter"]
        self.scalar_field = options["scalar_field"] or None
        self.tombstones = options.get("tombstones") == "true"
        """A key-value bucket's changes: deletes read as rows (an enrich step's table)."""
        self.avro = AvroReader.from_options(options)
        self.protobuf = ProtobufReader.from_options(options)
        self.heartbeat = options["heartbeat"] or None
        """The event-time field of a source that sends heartbeats (see _heartbeat)."""
        self.filter_subjects: list[str] = json.loads(options["filter_subjects"])
        self.phase_ms = int(options["phase_ms"])
        self.interval_ms = int(options["interval_ms"])
        self._catching_up = False
        self._planned_before = False
        """Whether this query planned a batch since it (re)started: the first one never
        waits for its slot — a query started on a failed node's behalf has that node's
        backlog to work off, and its output is already late."""
        self._fresh = True  # no offset planned since this query (re)started
        self._idle_since: tuple[str, float] | None = None
        """The agreed batch after which this replica found nothing new, and since when."""
        self._pace = SlotPacer(self.phase_ms, self.interval_ms)
        """One new batch per interval, at this query's slot (plan queries run with a
        zero Spark trigger)."""
        self.target: int | None = None  # Trigger.AvailableNow's end
        self._client: SyncNats | None = None
        self._consumer_ready = False
        self._progress_to = 0
        self._advancing: Future[None] | None = None
        """The progress consumer's move in the background (see :meth:`commit`)."""
        self.batch_plan = options.get("batch_plan") or None
        """Key prefix of the batch ends this query agrees with its replicas (hot
        standby; :mod:`spanflow.nats.batch_plan`), None when it plans alone."""
        self._plan: BatchPlan | None = None
        self._known_state: tuple[int, int] | None = None
        """The stream's (first, last) at its last answer."""
        self._silence = Silence(f"stream {self.stream}")
        self.checkpoint = options.get("checkpoint") or None
        self.passive = options.get("passive") == "true"
        """Only looking (a fit over history): no progress consumer, no dead letters."""
        self.late_rules = tuple(
            LateRule.from_json(r) for r in json.loads(options.get("late_rules") or "[]")
        )
        """The windows this source's records reach: a record late for all of them is
        dead-lettered here (reason ``late``) rather than dropped by Spark."""

    # -- driver side -----------------------------------------------------------------
    @property
    def client(self) -> SyncNats:
        if self._client is None:
            self._client = SyncNats(self.url)
        return self._client

    def _state(self) -> tuple[int, int]:
        """(first, last) sequence of the stream.

        While the stream elects a leader (a NATS server died: 4 to 9 s) its info does
        not come; failing here would fail the query, and restarting it costs seconds
        more than the election. So an answer that does not come within
        :data:`STATE_TIMEOUT` is read as "nothing new since the last answer" (see
        :class:`Silence`). A stream that does not exist fails at once."""
        c = self.client
        try:
            wait = STATE_TIMEOUT if self._known_state is not None else FIRST_STATE_TIMEOUT
            info = c.run(lambda: asyncio.wait_for(c.js.stream_info(self.stream), wait))
        except Exception as exc:
            if self._known_state is None or not unanswered(exc):
                raise
            self._silence.tolerate(exc)
            return self._known_state
        self._silence.answered()
        self._known_state = (max(info.state.first_seq, 1), info.state.last_seq)
        return self._known_state

    def initialOffset(self) -> dict[str, int]:
        first, last = self._state()
        seq = last + 1 if self.start_at == "latest" else first
        plan = self._shared_plan()
        return {"seq": seq if plan is None else int(plan.agree("initial", seq))}

    def _shared_plan(self) -> BatchPlan | None:
        if self.batch_plan is not None and self._plan is None:
            self._plan = BatchPlan(self.client, plan_key(self.batch_plan, self.step))
        return self._plan

    def _planned_offset(
        self, plan: BatchPlan, start: dict[str, int], limit: ReadLimit
    ) -> dict[str, int]:
        """The end every replica gives the batch from ``start``: the first one proposed.

        A batch a replica already planned runs at once (a replica that restarted behind
        its peer catches up batch after batch: such queries run with a zero trigger,
        and this source keeps the pace). A new batch is planned at this query's slot,
        once per trigger interval. With nothing new, a replica idle for an interval
        after a data batch (or just restarted) proposes an idle tick: the same
        sequence, one more beat — an empty batch (the last record read again as a
        heartbeat) in which the windows the last data passed are emitted. One tick per
        idle spell: the tick's end carries ``idle``."""
        seq, beat = start["seq"], int(start.get("beat", 0))
        name = str(seq) if not beat else f"{seq}-{beat}"
        agreed = plan.agreed(name)
        if agreed is not None:
            self._fresh = False
            return dict(agreed)
        if not self._pace.due():
            return dict(start)  # not yet: Spark asks again in a moment
        _, _, end = self._available_end(start, limit)
        fresh, self._fresh = self._fresh, False
        if end > seq:
            return dict(plan.agree(name, {"seq": end, "beat": beat}))
        if self.heartbeat and not start.get("idle") and (fresh or self._idle_long_enough(name)):
            return dict(plan.agree(name, {"seq": seq, "beat": beat + 1, "idle": 1}))
        return dict(start)

    def _idle_long_enough(self, name: str) -> bool:
        """Whether this replica has found nothing new after the batch ``name`` for a
        trigger interval."""
        now = time.monotonic()
        if self._idle_since is None or self._idle_since[0] != name:
            self._idle_since = (name, now)
        return now - self._idle_since[1] >= max(self.interval_ms, 100) / 1000

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._state()[1] + 1

    def _available_end(self, start: dict[str, int], limit: ReadLimit) -> tuple[int, int, int]:
        """(first, last) sequence of the stream and where a batch from ``start`` would
        end under ``limit`` (and Trigger.AvailableNow's target)."""
        first, last = self._state()
        begin = max(start["seq"], first)
        end = last + 1
        if self.target is not None:
            end = min(end, self.target)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            end = min(end, begin + self.max_rows)
        self._catching_up = end <= last  # more is waiting than one batch takes
        return first, last, max(end, start["seq"])

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        plan = self._shared_plan()
        if plan is not None:  # replicas run the same batches, idle ticks included
            try:
                return self._planned_offset(plan, start, limit)
            except Exception as exc:  # the plan's bucket elects a leader: wait for it
                if not unanswered(exc):
                    raise
                self._silence.tolerate(exc)
                return dict(start)
        if self.target is None and not self._catching_up and self._planned_before:
            wait_for_slot(self.phase_ms, self.interval_ms)  # see spanflow.spark.query.stagger
        self._planned_before = True
        first, _, end = self._available_end(start, limit)
        if not self.heartbeat:
            return {"seq": end}
        beat = int(start.get("beat", 0))
        if self._fresh and end == start["seq"] and start["seq"] > first:
            beat += 1  # idle after a restart: one heartbeat batch (see _heartbeat)
        self._fresh = False
        return {"seq": end, "beat": beat}

    def reportLatestOffset(self) -> dict[str, int] | None:
        return {"seq": self._state()[1] + 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        s, e = start["seq"], end["seq"]
        if e <= s:  # nothing new (Spark may plan an empty range, e.g. for a no-data batch)
            return [SeqRange(s, s, heartbeat=int(end.get("beat", 0)) > int(start.get("beat", 0)))]
        n = max(1, min(self.partitions_per_batch, e - s))
        step = -(-(e - s) // n)
        late = self._late_watermark()
        ranges: list[InputPartition] = [
            SeqRange(lo, min(lo + step, e), late_before_us=late) for lo in range(s, e, step)
        ]
        return ranges or [SeqRange(s, e, late_before_us=late)]

    def _late_watermark(self) -> int | None:
        if not self.late_rules or not self.heartbeat or not self.checkpoint:
            return None
        return late_watermark_us(self.checkpoint)

    def commit(self, end: dict[str, int]) -> None:
        """Move the progress consumer (what ``nats consumer info`` and lag dashboards
        show; Spark's checkpoint holds the offsets that count) to ``end``, in the
        background: Spark starts no batch while ``commit`` runs, and through a leader
        election the consumer does not answer for seconds — a blocking move held the
        next batch that long. One move runs at a time and always ends at the newest
        position."""
        if self.passive:
            return
        self._progress_to = int(end["seq"])
        if self._advancing is None or self._advancing.done():
            self._advancing = self.client.submit(self._advance_progress)

    async def _advance_progress(self) -> None:
        c = self.client
        done = None
        while done != self._progress_to:
            target = self._progress_to
            try:
                await self._ensure_progress_consumer()
                await c.js.reset_consumer(self.stream, self.consumer, seq=target, timeout=2)
            except Exception as exc:
                self._consumer_ready = False
                log.warning(
                    "could not advance consumer %s on %s: %s", self.consumer, self.stream, exc
                )
                return  # the next commit tries again
            done = target

    async def _ensure_progress_consumer(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        if self._consumer_ready:
            return
        c = self.client
        # A reset of a missing consumer times out instead of failing: create it first.
        try:
            await c.js.consumer_info(self.stream, self.consumer, timeout=2)
        except NotFoundError:
            await c.js.add_consumer(
                self.stream,
                ConsumerConfig(
                    durable_name=self.consumer,
                    deliver_policy=DeliverPolicy.ALL,
                    ack_policy=AckPolicy.ALL,
                    description=f"spanflow progress of {self.pipeline}/{self.step}",
                ),
                timeout=2,
            )
        self._consumer_ready = True

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- executor side ---------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        worker_logs.ensure()
        assert isinstance(partition, SeqRange)
        decoder = Decoder(
            self.format,
            self.schema_fields,
            self.csv_delimiter,
            self.scalar_field,
            self.tombstones,
            avro=self.avro,
            protobuf=self.protobuf,
        )

        async def fetch() -> list[Any]:
            nc = await connect(self.url)
            try:
                if partition.heartbeat:
                    return await self._heartbeat(nc, decoder, partition.start)
                messages = await read_range_fast(
                    nc,
                    self.url,
                    self.stream,
                    partition.start,
                    partition.end,
                    subjects=self.filter_subjects,
                )
                beats = [m for m in messages if is_beat(m.subject, m.data)]
                if beats:  # a site's watermark beats: none is a record
                    messages = [m for m in messages if not is_beat(m.subject, m.data)]
                batches = self._watermark_beat(decoder, beats)
                for lo in range(0, len(messages), BATCH_ROWS):
                    batch, rejects = decoder.decode(messages[lo : lo + BATCH_ROWS])
                    if partition.late_before_us is not None:
                        chunk = messages[lo : lo + BATCH_ROWS]
                        batch = await self._without_late(nc, batch, chunk, partition.late_before_us)
                    batches.append(batch)
                    letters = [
                        DeadLetter(
                            msg_id=f"{self.pipeline}:{self.step}:{m.seq}",
                            data=m.data,
                            reason=reason,
                            stream=self.stream,
                            subject=m.subject,
                            seq=m.seq,
                        )
                        for m, reason in rejects
                    ]
                    if not self.passive:
                        await publish_dead_letters(nc, self.pipeline, self.step, letters)
                return batches
            finally:
                await nc.close()

        # A range read while its stream elects a leader is tried again, not failed (a
        # query restart costs more than the election); dead letters repeat by message id.
        yield from through_elections(
            lambda: asyncio.run(fetch()),
            f"reading {self.stream} [{partition.start}, {partition.end})",
        )

    async def _without_late(
        self, nc: Client, batch: pa.RecordBatch, messages: list[RawRecord], watermark_us: int
    ) -> pa.RecordBatch:
        """``batch`` less its records late for every window they reach, which go to the
        dead letters (subject ``….<step>.late``, reason ``late: …``)."""
        assert self.heartbeat is not None
        late = late_rows(batch, self.heartbeat, self.late_rules, watermark_us)
        if not len(late):
            return batch
        seqs = batch.column("_seq").to_pylist()
        subjects = batch.column("_subject").to_pylist()
        times = batch.column(self.heartbeat).to_pylist()
        by_seq = {m.seq: m.data for m in messages}
        reason = late_reason(self.late_rules, watermark_us)
        letters = [
            DeadLetter(
                msg_id=f"{self.pipeline}:{self.step}:{seqs[i]}",
                data=by_seq[seqs[i]],
                reason=f"late: event time {times[i].isoformat()} {reason}",
                stream=self.stream,
                subject=subjects[i] or "",
                seq=seqs[i],
            )
            for i in late
        ]
        await publish_dead_letters(nc, self.pipeline, self.step, letters, kind=LATE)
        keep = np.setdiff1d(np.arange(batch.num_rows), late)
        return batch.take(pa.array(keep))

    async def _heartbeat(self, nc: Client, decoder: Decoder, start: int) -> list[Any]:
        """The last record before ``start`` again, marked ``_heartbeat`` (the compiled
        source drops it right after its watermark).

        Spark keeps each source's watermark only in memory: after a restart, a source
        that gets no new data counts as having seen nothing, and with several sources (a
        join, a union of sites) the query's minimum watermark then stays where it was
        restored, forever. So the first offset a source with event time plans after a
        restart, when it has nothing new, bumps a ``beat`` counter in the offset: Spark
        sees new data, plans this one-record range, and the watermark sees this
        source's event time again. The offset log records the beat, so a replay of the
        batch reads the same copy."""
        last = await last_before(nc, self.stream, start, subjects=self.filter_subjects)
        if last is None:
            return []
        if is_beat(last.subject, last.data):
            return self._watermark_beat(decoder, [last])
        return self._as_heartbeat(decoder, last)

    def _watermark_beat(self, decoder: Decoder, beats: list[RawRecord]) -> list[Any]:
        """The latest of a site's watermark beats as one heartbeat row with that event
        time (:mod:`spanflow.spark.query.watermark_beats`); nothing for a source without event
        time, which has no use for them."""
        times = [t for t in (beat_time(m.data) for m in beats) if t]
        if not self.heartbeat or not times:
            return []
        latest = max(times, key=lambda t: datetime.fromisoformat(t))
        last = beats[-1]
        body = orjson.dumps({self.heartbeat: latest})
        return self._as_heartbeat(
            decoder, RawRecord(last.seq, last.subject, body, last.published_us)
        )

    def _as_heartbeat(self, decoder: Decoder, record: RawRecord) -> list[Any]:
        """``record`` decoded and marked ``_heartbeat`` (nothing if it lacks event time)."""
        assert self.heartbeat is not None
        batch, _ = decoder.decode([record])  # a malformed record gives no heartbeat
        if batch.num_rows != 1 or batch.column(self.heartbeat)[0].as_py() is None:
            return []
        index = batch.schema.get_field_index("_heartbeat")
        beat = batch.set_column(index, "_heartbeat", pa.array([True], pa.bool_()))
        return [beat]
