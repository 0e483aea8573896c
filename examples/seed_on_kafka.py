"""The seed pipeline between two Kafka topics, on one machine, in one command:

    .venv/bin/python examples/seed_on_kafka.py

It starts a Kafka-wire broker (Tansu, in memory) and an embedded NATS server (where
dead letters go), runs examples/seed_kafka.yaml on Spark with its topics on that
broker (created with the file's parallelism, 3 partitions), produces a reading a second
from three sensors keyed by sensor (their own ``time``), and prints what reaches the
output topic, read as a read_committed consumer would: each reading plus 1 (``sum``),
and per sensor and 10-second window the average of its running count (``count`` then
``average``). A last reading 60 s later moves event time on, which closes the windows.
Against your own brokers, run the file itself:
``spanflow run examples/seed_kafka.yaml --kafka broker-1:9092``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
SENSORS = ("sensor-1", "sensor-2", "sensor-3")
START = 1_767_225_600.0
"""2026-01-01T00:00:00Z: the readings' first second (on a window boundary)."""


def numbers(n: int = 30) -> list[tuple[str, bytes]]:
    """(key, value): a reading a second, sensor by sensor, then one that is not a
    number and one 60 s after the others (it closes their windows)."""
    out = []
    for i in range(n):
        reading = {"value": i + 0.5, "time": START + i}
        out.append((SENSORS[i % 3], orjson.dumps(reading)))
    out.append((SENSORS[0], b'"not a number"'))
    out.append((SENSORS[0], orjson.dumps({"value": 0, "time": START + n + 60})))
    return out


def produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    from confluent_kafka import Producer

    # one record per produce batch: Tansu's high watermark lags after larger batches
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                         "batch.num.messages": 1, "partitioner": "murmur2_random"})  # fmt: skip
    for key, value in records:
        producer.produce(topic, value, key=key.encode())
        producer.flush(10)


def consume(bootstrap: str, topic: str) -> list[tuple[str, dict[str, Any]]]:
    """(key, record) of every committed record, partition by partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "example-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[tuple[int, int, str, dict[str, Any]]] = []
    ended: set[int] = set()
    while len(ended) < len(parts):
        for m in consumer.consume(500, timeout=0.5):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
                continue
            out.append((m.partition(), m.offset(), m.key().decode(), orjson.loads(m.value())))
    consumer.close()
    return [(key, record) for _, _, key, record in sorted(out)]


def run_on(
    spark: Any,
    nats_url: str,
    bootstrap: str,
    checkpoints: Path,
    records: list[tuple[str, bytes]],
    expect: int,
    timeout: float = 180.0,
) -> list[tuple[str, dict[str, Any]]]:
    """Run the seed file against running servers until ``expect`` records are on the
    output topic; the output topic's (key, record)."""
    from spanflow.api import load_pipeline
    from spanflow.spark.runner import PipelineRunner

    spec = load_pipeline(HERE / "seed_kafka.yaml", bootstrap=bootstrap)
    # start() creates both topics with the file's parallelism (3 partitions)
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        produce(bootstrap, "numbers", records)
        deadline = time.monotonic() + timeout
        while len(out := consume(bootstrap, "results")) < expect:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(out)} of {expect} results in {timeout:g} s")
            time.sleep(1)
    finally:
        runner.stop()
    return out


def run(records: list[tuple[str, bytes]], expect: int) -> list[tuple[str, dict[str, Any]]]:
    """Start a broker, NATS and Spark on this machine, run, stop them."""
    from spanflow.local.kafka_broker import LocalKafka
    from spanflow.nats import EmbeddedNats
    from spanflow.spark.session import build_session

    with tempfile.TemporaryDirectory() as tmp, LocalKafka() as kafka:
        nats = EmbeddedNats(Path(tmp) / "nats")
        nats.start()
        try:
            spark = build_session(app_name="seed-on-kafka")
            try:
                cp = Path(tmp) / "cp"
                return run_on(spark, nats.url, kafka.bootstrap, cp, records, expect)
            finally:
                spark.stop()
        finally:
            nats.stop()


def main() -> None:
    # 31 readings plus 1; 3 sensors by 3 closed windows (the last reading's stays open)
    out = run(numbers(), expect=31 + 9)
    print(f"{len(out)} records on the topic 'results' (each reading plus 1, and the "
          "average count per sensor and window; the non-number went to the dead-letter "
          "stream):")  # fmt: skip
    for key, record in out:
        print(f"  {key:9} {record}")
    sys.exit(0)


if __name__ == "__main__":
    main()
