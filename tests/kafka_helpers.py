"""Kafka clients for tests (confluent-kafka, not spanflow's connector): create topics,
produce, read everything committed (or everything written, aborted included)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(10)


def produce(
    bootstrap: str,
    topic: str,
    records: list[Any],
    *,
    key: str | None = None,
    partition_of: Any = None,
) -> None:
    """Each record as JSON (bytes are sent as they are), keyed by ``record[key]``."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random",
         "enable.idempotence": True}
    )  # fmt: skip
    for record in records:
        value = record if isinstance(record, bytes) else orjson.dumps(record)
        k = str(record[key]).encode() if key and isinstance(record, dict) else None
        extra = {"partition": partition_of(record)} if partition_of else {}
        producer.produce(topic, value, key=k, **extra)
        producer.poll(0)
    assert producer.flush(30) == 0


def read_topic(
    bootstrap: str, topic: str, timeout: float = 30.0, isolation: str = "read_committed"
) -> list[Any]:
    """Every committed record of every partition: (partition, offset, key, value, headers);
    with ``isolation="read_uncommitted"``, aborted records too."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
         "enable.auto.commit": False, "isolation.level": isolation,
         "enable.partition.eof": True}
    )  # fmt: skip
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    parts = sorted(meta.partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out, done = [], set()
    deadline = time.monotonic() + timeout
    try:
        while len(done) < len(parts):
            assert time.monotonic() < deadline, f"{topic}: partitions {done} of {parts} read"
            for m in consumer.consume(1000, timeout=0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                        continue
                    raise RuntimeError(str(m.error()))
                out.append((m.partition(), m.offset(), m.key(), m.value(), m.headers()))
    finally:
        consumer.close()
    return out


def read_values(
    bootstrap: str, topic: str, isolation: str = "read_committed"
) -> list[dict[str, Any]]:
    return [orjson.loads(v) for _, _, _, v, _ in read_topic(bootstrap, topic, isolation=isolation)]


def record_times(bootstrap: str, topic: str) -> list[float]:
    """When each committed record of partition 0 was produced (Unix seconds), in order."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"times-{time.monotonic_ns()}",
         "enable.auto.commit": False, "isolation.level": "read_committed",
         "enable.partition.eof": True}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[float] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        return out
                    raise RuntimeError(str(m.error()))
                out.append(m.timestamp()[1] / 1000)
        raise AssertionError(f"{topic}: not read within 30 s")
    finally:
        consumer.close()
