"""Kafka on Spark: two source readers and a transactional batch writer.

Source, ``reader: spark``
    Spark's own Kafka connector (``format("kafka")``, jars from ``spanflow.spark.jvm.jars``):
    offsets in Spark's checkpoint, ``read_committed``, at most ``max_rows_per_batch``
    records a batch; its rows go through :class:`RecordDecoder` in a ``mapInArrow``,
    which decodes values exactly as the Python reader does.

Source, ``reader: python`` (the default; a ``DataSourceStreamReader`` on confluent-kafka)
    Offsets are ``{"p": {"<partition>": next_offset}}``. ``latestOffset`` asks the
    brokers for each partition's end (the last stable offset, as the reader's
    consumer is ``read_committed``) and caps the batch at ``max_rows`` spread over the
    partitions; ``partitions`` gives one input partition per Kafka partition, so the
    records of a key (one Kafka partition) keep their order; ``read`` assigns and
    seeks to the range's start and stops at its end, so a replayed batch reads the
    same records. Each record's value is decoded like a JetStream message (formats,
    dead letters); its topic, offset and timestamp fill ``_subject``, ``_seq`` and
    ``_published``, and ``_key``, ``_partition`` and ``_headers`` are added.
    ``commit`` stores the offsets in the consumer group, for monitoring only.

Sink (:class:`KafkaWriter`)
    Each micro-batch is one Kafka transaction: the rows (JSON values, the key from a
    column, headers from columns) and a marker record ``{"batch": id}`` on the sink's
    marker topic ``_spanflow.<pipeline>.<sink>``. Before its first batch a writer
    reads the last committed marker; a batch at or below it was committed before a
    crash and is skipped. A crash inside a transaction leaves it open; the restarted
    writer's ``init_transactions`` (same transactional id) aborts it. Consumers that
    read with ``isolation.level=read_committed`` see every row exactly once.

    Under hot standby both replicas' writers share the transactional id, so only the
    producer initialised last can commit: the other one's next transaction fails as
    fenced, and it follows, skipping each batch once the marker topic shows it
    committed. A follower that waits :data:`TAKEOVER_AFTER` seconds for a batch in
    vain (the writer's node died, or lags) starts a producer of its own, which fences
    the writer and aborts its open transaction, reads the marker again and writes the
    batch unless it is there. Kafka's fencing alone keeps each batch once; the
    waiting only keeps the two from taking the writing from each other every batch.

Where each hook runs: offsets and commits on the driver, ``read`` on executors; the
writer on the driver (``toArrow``, as the JetStream sink).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from spanflow.errors import CompileError, SpanflowError
from spanflow.faults import pause_here
from spanflow.protocol.raw import RawRecord
from spanflow.spark.connectors import (
    BatchWriter,
    SinkContext,
    SourceContext,
    checks,
    reads,
    writes,
)
from spanflow.spark.deadletter import LATE, DeadLetter, send_dead_letters
from spanflow.spark.formats import AvroReader, Decoder, ProtobufReader
from spanflow.spark.late_records import late_reason, late_rows, late_watermark_us
from spanflow.spec.connectors.kafka import KafkaSinkOptions, KafkaSourceOptions
from spanflow.spec.lateness import LateRule
from spanflow.spec.schema import StreamFormat
from spanflow.spec.steps.io import SinkStep, SourceStep

log = logging.getLogger(__name__)

KAFKA_COLUMNS = "_key string, _partition int, _headers map<string,string>"
"""Columns a Kafka source adds after the common metadata columns."""
METADATA_TIMEOUT = 10.0
"""Seconds to wait for the brokers' answer about a topic's partitions and offsets."""


_LIBRDKAFKA_LOG = logging.getLogger("spanflow.kafka.client")


def _client_config(
    bootstrap: str, config: dict[str, str], config_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """librdkafka settings: its own log goes through Python logging (not stderr), and a
    broker that refuses connections is retried with back-off instead of every 100 ms.
    Secret settings come from the environment of the process that connects
    (``config_env``), never from the spec."""
    return {
        "bootstrap.servers": bootstrap,
        "client.id": "spanflow",
        "logger": _LIBRDKAFKA_LOG,
        "reconnect.backoff.ms": 500,
        "reconnect.backoff.max.ms": 10_000,
        **config,
        **_from_env(config_env or {}),
    }


def _from_env(config_env: dict[str, str]) -> dict[str, str]:
    values = {}
    for key, name in config_env.items():
        value = os.environ.get(name)
        if value is None:
            raise SpanflowError(
                f"Kafka setting {key!r} comes from the environment variable {name}, "
                "which is not set where this query runs"
            )
        values[key] = value
    return values


def describe_failure(what: str, bootstrap: str, exc: BaseException) -> str:
    return f"{what} ({bootstrap}): {exc}"


# -- source --------------------------------------------------------------------------------
@reads("kafka")
def read_kafka(ctx: SourceContext, step: SourceStep) -> DataFrame:
    options = step.options
    assert isinstance(options, KafkaSourceOptions)
    settings = _reader_options(ctx, step, options)
    if options.reader == "spark":
        return _read_with_spark_connector(ctx, step, options, settings)
    name = f"spanflow_kafka_{ctx.query_token}"
    # A registration of its own per query, as for JetStream (see register_isolated)
    cls = type(
        f"KafkaDataSource_{ctx.query_token}",
        (KafkaDataSource,),
        {"name": classmethod(lambda c: name)},
    )
    ctx.spark.dataSource.register(cls)
    return ctx.reader().format(name).options(**settings).load()


def _reader_options(
    ctx: SourceContext, step: SourceStep, options: KafkaSourceOptions
) -> dict[str, str]:
    """What a reader needs, as strings: the topic and how to decode its records."""
    start_time = options.start_time.isoformat() if options.start_time else ""
    return {
        "bootstrap": options.bootstrap,
        "topic": options.topic,
        "config": json.dumps(options.config),
        "config_env": json.dumps(options.config_env),
        "group": options.group or f"spanflow.{ctx.pipeline}.{step.id}",
        "passive": "true" if ctx.passive else "false",
        "start": step.start,
        "start_time": start_time,
        "read_timeout": str(options.read_timeout),
        "max_rows": str(step.max_rows_per_batch),
        "format": step.format.value,
        "schema": json.dumps(ctx.schema),
        "ddl": f"{ctx.ddl}, {KAFKA_COLUMNS}",
        "csv_delimiter": step.csv_delimiter,
        "scalar_field": step.scalar_field or "",
        "avro_schema": json.dumps(step.avro_schema) if step.avro_schema else "",
        "avro_framing": step.avro_framing,
        "protobuf": step.protobuf.model_dump_json() if step.protobuf else "",
        "url": ctx.nats_url,
        "pipeline": ctx.pipeline,
        "step": step.id,
        "event_time": step.event_time or "",
        "checkpoint": ctx.checkpoint or "",
        "late_rules": json.dumps([r.to_json() for r in ctx.late_rules]),
    }


def _read_with_spark_connector(
    ctx: SourceContext, step: SourceStep, options: KafkaSourceOptions, settings: dict[str, str]
) -> DataFrame:
    """Spark's own Kafka source (offsets in Spark's checkpoint, one Spark partition per
    Kafka partition, read_committed), its records decoded like the Python reader's by a
    ``mapInArrow`` that keeps each partition's order and sends bad records to the
    dead-letter stream."""
    from spanflow.spark.jvm.jars import KAFKA_CONNECTOR, why_missing

    reason = why_missing(KAFKA_CONNECTOR.name)
    if reason:
        raise CompileError(
            step.id, f"Spark's Kafka connector is missing ({reason}); or set reader: python"
        )
    reader = (
        ctx.reader()
        .format("kafka")
        .option("kafka.bootstrap.servers", options.bootstrap)
        .option("subscribe", options.topic)
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", str(step.max_rows_per_batch))
        .option("groupIdPrefix", settings["group"])
    )
    if options.start_time:
        millis = int(options.start_time.timestamp() * 1000)
        reader = reader.option("startingTimestamp", str(millis)).option(
            "startingOffsetsByTimestampStrategy", "latest"
        )
    else:
        reader = reader.option("startingOffsets", step.start)
    raw = reader.load().select("key", "value", "partition", "offset", "timestamp", "headers")
    return raw.mapInArrow(RecordDecoder(settings).arrow_batches, settings["ddl"])


@dataclass
class KafkaRecord:
    """One record as either reader hands it to the decoder."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: list[tuple[str, str]]


class RecordDecoder:
    """Kafka records to the pipeline's columns, bad ones to the dead-letter stream;
    built on the driver from the reader's options, run in Python workers."""

    def __init__(self, options: dict[str, str]) -> None:
        self.topic = options["topic"]
        self.format = StreamFormat(options.get("format", "json"))
        self.schema_fields: dict[str, str] = json.loads(options.get("schema", "{}"))
        self.csv_delimiter = options.get("csv_delimiter", ",")
        self.scalar_field = options.get("scalar_field") or None
        self.avro = AvroReader.from_options(options)
        self.protobuf = ProtobufReader.from_options(options)
        self.url = options["url"]
        self.pipeline = options["pipeline"]
        self.step = options["step"]
        self.passive = options.get("passive") == "true"
        self.event_time = options.get("event_time") or None
        self.late_rules = tuple(
            LateRule.from_json(r) for r in json.loads(options.get("late_rules") or "[]")
        )
        """The windows this source's records reach (see :mod:`spanflow.spark.late_records`)."""

    def decode(
        self, records: list[KafkaRecord], late_before_us: int | None = None
    ) -> pa.RecordBatch:
        """The records as the pipeline's columns; malformed ones, and (given the
        watermark Spark drops late records by) late ones, to the dead letters."""
        decoder = Decoder(self.format, self.schema_fields, self.csv_delimiter,
                          self.scalar_field, avro=self.avro, protobuf=self.protobuf)  # fmt: skip
        messages = [
            RawRecord(seq=r.offset, subject=self.topic, data=r.value or b"",
                      published_us=max(r.timestamp_ms, 0) * 1000)
            for r in records
        ]  # fmt: skip
        batch, rejects = decoder.decode(messages)
        record_of = {id(m): r for r, m in zip(records, messages, strict=True)}
        if rejects:
            letters = [self._letter(record_of[id(m)], m, why) for m, why in rejects]
            if not self.passive:
                send_dead_letters(self.url, self.pipeline, self.step, letters)
        rejected = {id(m) for m, _ in rejects}
        kept = [r for r, m in zip(records, messages, strict=True) if id(m) not in rejected]
        extra = [
            pa.array([_text(r.key) for r in kept], pa.string()),
            pa.array([r.partition for r in kept], pa.int32()),
            pa.array([r.headers for r in kept], pa.map_(pa.string(), pa.string())),
        ]
        names = [*batch.schema.names, "_key", "_partition", "_headers"]
        out = pa.RecordBatch.from_arrays([*batch.columns, *extra], names=names)
        if late_before_us is None or not self.late_rules or self.event_time is None:
            return out
        return self._without_late(out, kept, late_before_us)

    def _without_late(
        self, batch: pa.RecordBatch, records: list[KafkaRecord], watermark_us: int
    ) -> pa.RecordBatch:
        """``batch`` (one row per record of ``records``) less its late rows, which go
        to the dead letters (subject ``….<step>.late``, reason ``late: …``)."""
        assert self.event_time is not None
        late = late_rows(batch, self.event_time, self.late_rules, watermark_us)
        if not len(late):
            return batch
        times = batch.column(self.event_time).to_pylist()
        reason = late_reason(self.late_rules, watermark_us)
        letters = []
        for i in late:
            record = records[i]
            message = RawRecord(record.offset, self.topic, record.value or b"", 0)
            why = f"late: event time {times[i].isoformat()} {reason}"
            letters.append(self._letter(record, message, why))
        send_dead_letters(self.url, self.pipeline, self.step, letters, kind=LATE)
        keep = np.setdiff1d(np.arange(batch.num_rows), late)
        return batch.take(pa.array(keep))

    def _letter(self, record: KafkaRecord, message: RawRecord, reason: str) -> DeadLetter:
        where = f"{record.partition}:{record.offset}"
        return DeadLetter(
            msg_id=f"{self.pipeline}:{self.step}:{where}",
            data=message.data,
            reason=reason,
            stream=f"kafka:{self.topic}",
            subject=f"{self.topic}[{record.partition}]",
            seq=record.offset,
        )

    def arrow_batches(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow``: Spark's Kafka rows (key, value, partition, offset, timestamp,
        headers) decoded, batch by batch, in order; read column by column (a dict per
        row would cost more than the decoding)."""
        for batch in batches:
            column = batch.column
            millis = pc.cast(column("timestamp"), pa.int64()).to_pylist()  # microseconds
            headers = column("headers")
            has_headers = pc.sum(pc.list_value_length(headers).fill_null(0)).as_py() or 0
            records = [
                KafkaRecord(partition=p, offset=o, key=k, value=v,
                            timestamp_ms=(t or 0) // 1000, headers=_pairs(h) if h else [])
                for p, o, k, v, t, h in zip(
                    column("partition").to_pylist(), column("offset").to_pylist(),
                    column("key").to_pylist(), column("value").to_pylist(), millis,
                    headers.to_pylist() if has_headers else [None] * batch.num_rows,
                    strict=True,
                )
            ]  # fmt: skip
            yield self.decode(records)


def _pairs(headers: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(h["key"], _text(h["value"]) or "") for h in headers]


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "spanflow_kafka"

    def schema(self) -> str:
        return self.options["ddl"]

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaReader(dict(self.options))


@dataclass
class OffsetRange(InputPartition):
    partition: int
    start: int
    end: int
    late_before_us: int | None = None
    """The watermark Spark drops late records by in this batch (µs; None: unknown)."""


class KafkaReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.config: dict[str, str] = json.loads(options.get("config", "{}"))
        self.config_env: dict[str, str] = json.loads(options.get("config_env", "{}"))
        self.group = options["group"]
        self.start_at = options.get("start", "earliest")
        self.start_time = options.get("start_time") or None
        self.read_timeout = float(options.get("read_timeout", "30"))
        self.max_rows = int(options.get("max_rows", "200000"))
        self.decoder = RecordDecoder(options)
        self.checkpoint = options.get("checkpoint") or None
        self._consumer: Any = None

    # -- driver side -----------------------------------------------------------------
    def _consumer_config(self) -> dict[str, Any]:
        return {
            **_client_config(self.bootstrap, self.config, self.config_env),
            "group.id": self.group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(self._consumer_config())
        return self._consumer

    def _partition_ids(self) -> list[int]:
        try:
            meta = self.consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT)
        except Exception as exc:
            raise RuntimeError(
                describe_failure(f"kafka topic {self.topic!r} unreachable", self.bootstrap, exc)
            ) from None
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            reason = topic.error if topic is not None and topic.error else "no partitions"
            raise RuntimeError(f"kafka topic {self.topic!r} on {self.bootstrap}: {reason}")
        return sorted(topic.partitions)

    def _bounds(self) -> dict[int, tuple[int, int]]:
        """(first, end) offsets of every partition; ``end`` is where the next record
        will go (the last stable offset for this read_committed consumer)."""
        from confluent_kafka import TopicPartition

        out = {}
        for p in self._partition_ids():
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), timeout=METADATA_TIMEOUT, cached=False
            )
            out[p] = (max(low, 0), max(high, 0))
        return out

    def _at_time(self, partitions: list[int]) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        assert self.start_time is not None
        ms = int(datetime.fromisoformat(self.start_time).timestamp() * 1000)
        found = self.consumer.offsets_for_times(
            [TopicPartition(self.topic, p, ms) for p in partitions], timeout=METADATA_TIMEOUT
        )
        bounds = self._bounds()
        # -1: no record at or after the time: start at the partition's end
        return {
            tp.partition: tp.offset if tp.offset >= 0 else bounds[tp.partition][1] for tp in found
        }

    def initialOffset(self) -> dict[str, Any]:
        bounds = self._bounds()
        if self.start_time:
            starts = self._at_time(sorted(bounds))
        elif self.start_at == "latest":
            starts = {p: end for p, (_, end) in bounds.items()}
        else:
            starts = {p: first for p, (first, _) in bounds.items()}
        return {"p": {str(p): o for p, o in sorted(starts.items())}}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        bounds = self._bounds()
        begin = {
            p: max(int(start["p"].get(str(p), first)), first) for p, (first, _) in bounds.items()
        }
        waiting = {p: max(bounds[p][1] - begin[p], 0) for p in bounds}
        budget = self.max_rows
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            budget = sum(waiting.values())
        take = _share(waiting, budget)
        end = {str(p): begin[p] + take[p] for p in sorted(bounds)}
        # a partition the brokers no longer report keeps its offset
        for p, offset in start["p"].items():
            end.setdefault(p, int(offset))
        return {"p": end}

    def reportLatestOffset(self) -> dict[str, Any]:
        return {"p": {str(p): end for p, (_, end) in sorted(self._bounds().items())}}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        ranges: list[InputPartition] = []
        late = None
        if self.decoder.late_rules and self.decoder.event_time and self.checkpoint:
            late = late_watermark_us(self.checkpoint)
        for p, stop in sorted(end["p"].items(), key=lambda kv: int(kv[0])):
            begin = int(start["p"].get(p, stop))
            if int(stop) > begin:
                ranges.append(OffsetRange(int(p), begin, int(stop), late_before_us=late))
        return ranges

    def commit(self, end: dict[str, Any]) -> None:
        from confluent_kafka import TopicPartition

        if self.decoder.passive:
            return  # only looking: the pipeline's own query reports its progress
        offsets = [TopicPartition(self.topic, int(p), int(o)) for p, o in end["p"].items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # monitoring only: the checkpoint holds the real offsets
            log.warning("kafka group %s: offsets not committed: %s", self.group, exc)

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- executor side ---------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        records = [
            KafkaRecord(partition=partition.partition, offset=r.offset(), key=r.key(),
                        value=r.value(), timestamp_ms=r.timestamp()[1],
                        headers=[(k, _text(v) or "") for k, v in (r.headers() or [])])
            for r in self._fetch(partition)
        ]  # fmt: skip
        yield self.decoder.decode(records, partition.late_before_us)

    def _fetch(self, part: OffsetRange) -> list[Any]:
        """The records at offsets [start, end) of one partition, in offset order (fewer
        when transaction markers or aborted records fill some offsets)."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer({**self._consumer_config(), "enable.partition.eof": True})
        tp = TopicPartition(self.topic, part.partition, part.start)
        consumer.assign([tp])
        out: list[Any] = []
        deadline = time.monotonic() + self.read_timeout
        try:
            while True:
                for record in consumer.consume(num_messages=10_000, timeout=0.5):
                    error = record.error()
                    if error is not None and error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"kafka {self.topic}[{part.partition}]: {error}")
                    offset = record.offset()
                    if error is None and offset is not None and part.start <= offset < part.end:
                        out.append(record)
                position = consumer.position([tp])[0].offset
                if position >= part.end or (out and out[-1].offset() >= part.end - 1):
                    return out
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"kafka {self.topic}[{part.partition}]: offsets {part.start}..{part.end} "
                        f"not readable within {self.read_timeout:g} s (at {position})"
                    )
        finally:
            consumer.close()


def _share(waiting: dict[int, int], budget: int) -> dict[int, int]:
    """How many records to take from each partition: all when they fit the budget,
    else a share proportional to what waits (at least one where something waits)."""
    total = sum(waiting.values())
    if total <= budget:
        return dict(waiting)
    return {p: min(n, max(1 if n else 0, n * budget // total)) for p, n in waiting.items()}


def _text(value: bytes | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", errors="replace")


# -- sink ----------------------------------------------------------------------------------
TAKEOVER_AFTER = 1.0
"""Hot standby: seconds a replica whose producer the peer fenced waits for the peer to
commit a batch before it takes the writing over (the peer's node may have died)."""
MAX_HANDOVERS = 4
"""Times the replicas may take the writing from each other within one batch."""


def marker_topic(pipeline: str, sink: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"_spanflow.{pipeline}.{sink}")[:249]


@writes("kafka")
class KafkaWriter(BatchWriter):
    """One transaction per micro-batch, with the batch id on a marker topic."""

    def __init__(self, ctx: SinkContext, sink_id: str, options: KafkaSinkOptions) -> None:
        self.ctx = ctx
        self.options = options
        self.marker = marker_topic(ctx.pipeline, sink_id)
        self.transactional_id = options.transactional_id or f"spanflow.{ctx.pipeline}.{sink_id}"
        self.config = _client_config(options.bootstrap, options.config, options.config_env)
        self._producer: Any = None
        self.committed: int | None = None
        """The last batch id committed to Kafka (read from the marker topic at start)."""
        self.markers = MarkerLog(self.config, self.marker, f"{self.transactional_id}.markers")
        self._following = False
        """Hot standby: the peer replica's producer fenced this one's; wait for its
        commits (and take over when one does not come)."""

    def _start(self) -> None:
        """A new transactional producer. Its ``init_transactions`` fences every other
        producer with this transactional id (a crashed writer's, or the peer replica's)
        and aborts what it left open; the marker is read after that, so no batch can be
        committed between the read and this producer's own writes."""
        from confluent_kafka import Producer

        if self.committed is None:
            self._check_topics()
        producer = Producer(
            {
                **self.config,
                "transactional.id": self.transactional_id,
                "enable.idempotence": True,
                # the Java client's partitioner: a key lands where Java producers put it
                "partitioner": "murmur2_random",
                "linger.ms": 5,
                # a new producer waits for Kafka to abort the old one's open transaction,
                # asking again after each "concurrent transactions": not 1 s apart
                "retry.backoff.max.ms": 100,
                **self.options.config,
            }
        )
        producer.init_transactions(30)
        self.committed = self.markers.last()
        self._producer = producer

    def _check_topics(self) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.config)
        try:
            topics = admin.list_topics(timeout=METADATA_TIMEOUT).topics
        except Exception as exc:
            raise RuntimeError(
                describe_failure("kafka sink: brokers unreachable", self.options.bootstrap, exc)
            ) from None
        if self.options.topic not in topics:
            raise RuntimeError(
                f"kafka sink: topic {self.options.topic!r} does not exist on "
                f"{self.options.bootstrap} (create it with the partitions you want)"
            )
        if self.marker not in topics:
            _create_topic(admin, self.marker, 1)

    def write(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.toArrow().to_pylist()
        for _ in range(MAX_HANDOVERS):
            if self._producer is None:
                if self._following and self.markers.wait_for(batch_id, TAKEOVER_AFTER):
                    log.info("kafka sink %s: batch %d written by the peer", self.marker, batch_id)
                    return
                if self._following:
                    log.warning(
                        "kafka sink %s: the peer replica did not commit batch %d within "
                        "%.1f s; this replica writes from now on",
                        self.marker, batch_id, TAKEOVER_AFTER,
                    )  # fmt: skip
                self._start()
                self._following = False
            assert self.committed is not None
            if batch_id <= self.committed:
                log.info("kafka sink %s: batch %d is already committed", self.marker, batch_id)
                return
            self.ctx.check_fence()
            try:
                self._transaction(rows, batch_id)
                return
            except Exception as exc:
                if not (self.ctx.replicated and _fenced(exc)):
                    raise
                log.info(
                    "kafka sink %s: the peer replica took the writing over (%s)", self.marker, exc
                )
                self._producer, self._following = None, True
        raise RuntimeError(
            f"kafka sink {self.marker}: the replicas took the writing from each other "
            f"{MAX_HANDOVERS} times in batch {batch_id}"
        )

    def _transaction(self, rows: list[dict[str, Any]], batch_id: int) -> None:
        """The batch's rows and its marker in one transaction."""
        producer = self._producer
        producer.begin_transaction()
        try:
            for row in rows:
                self._produce(row)
            producer.produce(self.marker, orjson.dumps(self._marker_record(batch_id, len(rows))))
            pause_here("kafka-sink-open-transaction", prepare=lambda: producer.flush(30))
            producer.commit_transaction(60)
        except Exception:
            self._abort()
            raise
        self.committed = batch_id
        pause_here("kafka-sink-committed")  # Kafka has the batch; Spark's log not yet

    def _marker_record(self, batch_id: int, rows: int) -> dict[str, Any]:
        """The batch's marker; a fenced fragment's also says which replica wrote it (on
        which node), for whoever looks into a standby's handovers."""
        record: dict[str, Any] = {"batch": batch_id, "rows": rows}
        if self.ctx.fence is not None:
            record["by"] = self.ctx.fence.fragment_id
            record["node"] = self.ctx.fence.node
        return record

    def _produce(self, row: dict[str, Any]) -> None:
        record = {k: v for k, v in row.items() if not k.startswith("_")}
        value = orjson.dumps(record, option=orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z)
        key = _key_bytes(row.get(self.options.key)) if self.options.key else None
        headers = [(h, _header(row.get(h))) for h in self.options.headers]
        while True:
            try:
                self._producer.produce(self.options.topic, value, key=key, headers=headers or None)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                self._producer.poll(0.1)
        self._producer.poll(0)

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(30)
        except Exception as exc:  # a new producer (next restart) aborts it instead
            log.warning("kafka sink %s: abort failed: %s", self.marker, exc)
        self._producer = None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
        self.markers.close()


def _fenced(exc: BaseException) -> bool:
    """Whether ``exc`` says another producer with this transactional id took over (or
    left this one unusable: a fatal error, after which only a new producer writes)."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    error = exc.args[0]
    if not isinstance(error, KafkaError):
        return False
    # _FATAL: what produce() raises once the producer has a fatal error (its fencing,
    # seen by the background thread first); that error itself does not say fatal()
    fencing = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
               KafkaError._FATAL}  # fmt: skip
    return bool(error.fatal() or error.code() in fencing)


class MarkerLog:
    """The sink's marker topic, read ``read_committed`` from its start: the highest
    batch id committed so far, and a wait for a given batch (the follower replica)."""

    def __init__(self, config: dict[str, Any], topic: str, group: str) -> None:
        self.config, self.topic, self.group = config, topic, group
        self.highest = -1
        self._consumer: Any = None

    def _open(self) -> Any:
        from confluent_kafka import Consumer, TopicPartition

        if self._consumer is None:
            consumer = Consumer(
                {
                    **self.config,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    # the broker answers a fetch at the end after this long, not 500 ms:
                    # a takeover reads to the end at once, a follower sees a commit soon
                    "fetch.wait.max.ms": 50,
                }
            )
            tp = TopicPartition(self.topic, 0)
            low, _ = consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT, cached=False)
            consumer.assign([TopicPartition(self.topic, 0, max(low, 0))])
            self._consumer = consumer
        return self._consumer

    def _read(self, timeout: float) -> bool:
        """Read what is there; True at the end of the committed records. An end
        reported earlier may come before records stored since: every record counts."""
        from confluent_kafka import KafkaError

        at_end = False
        for record in self._open().consume(num_messages=1000, timeout=timeout):
            error = record.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"kafka marker topic {self.topic}: {error}")
                at_end = True
                continue
            at_end = False
            batch = int(orjson.loads(record.value() or b"{}").get("batch", -1))
            self.highest = max(self.highest, batch)
        return at_end

    def last(self) -> int:
        """The highest batch id committed (-1: none), reading to the end with a new
        consumer: one that already reported the end reports it once only, so waiting
        for that report again would wait for a record that may never come."""
        self.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._read(0.05):  # consume() waits its whole timeout for 1000 records
                return self.highest
        raise RuntimeError(f"kafka marker topic {self.topic}: not read within 30 s")

    def wait_for(self, batch_id: int, seconds: float) -> bool:
        """Whether batch ``batch_id`` (or a later one) gets committed within ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.highest < batch_id and time.monotonic() < deadline:
            self._read(min(0.05, max(0.0, deadline - time.monotonic())))
        return self.highest >= batch_id

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _key_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else orjson.dumps(value)


def _header(value: Any) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else orjson.dumps(value)


@checks("kafka")
def check_kafka(step: SourceStep | SinkStep, schema: StructType | None = None) -> None:
    """The brokers answer and the topic exists (a sink's marker topic is created when
    its first batch is written)."""
    from confluent_kafka.admin import AdminClient

    options = step.options
    assert isinstance(options, KafkaSourceOptions | KafkaSinkOptions)
    # the answer (or its absence) is the error raised below: the client's log is noise
    admin = AdminClient(
        {**_client_config(options.bootstrap, options.config, options.config_env), "log_level": 0}
    )
    try:
        topics = admin.list_topics(timeout=METADATA_TIMEOUT).topics
    except Exception as exc:
        raise CompileError(
            step.id, describe_failure("kafka brokers unreachable", options.bootstrap, exc)
        ) from None
    if options.topic in topics:
        return
    if options.partitions is None:
        raise CompileError(
            step.id,
            f"kafka topic {options.topic!r} does not exist on {options.bootstrap} "
            "(create it with as many partitions as the parallelism you want, or set "
            "'partitions' to have spanflow create it)",
        )
    try:
        _create_topic(admin, options.topic, options.partitions)
    except Exception as exc:
        raise CompileError(step.id, f"kafka topic {options.topic!r} not created: {exc}") from None


def _create_topic(admin: Any, topic: str, partitions: int) -> None:
    """Create a topic; one that another writer created meanwhile is fine."""
    from confluent_kafka.admin import NewTopic

    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        try:
            future.result(METADATA_TIMEOUT)
        except Exception as exc:
            if "already exists" not in str(exc).lower() and "TOPIC_ALREADY" not in str(exc):
                raise
