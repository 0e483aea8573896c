"""Hot standby with a transactional Kafka sink, on Apache Kafka: the replicas' writers
share one transactional id, so the producer initialised last writes and the other
follows the marker topic; a follower whose writer dies inside a transaction takes the
writing over (fencing it, aborting what it left open) and every batch is committed
once. Read back with a ``read_committed`` consumer."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from spanflow.spark.connectors.kafka import TAKEOVER_AFTER, _fenced
from tests.helpers import wait_for
from tests.kafka_helpers import create_topic, read_topic
from tests.spark.sink_replica import ArrowBatch, write_in_step, writer

pytestmark = [pytest.mark.slow, pytest.mark.solo]  # output-pause and takeover bounds

ROOT = Path(__file__).resolve().parents[2]


def _ids(kafka: str, topic: str, isolation: str = "read_committed") -> Counter[int]:
    return Counter(orjson.loads(r[3])["id"] for r in read_topic(kafka, topic, isolation=isolation))


def _marked(kafka: str, w: Any) -> Counter[int]:
    """Batch ids on writer ``w``'s marker topic, committed ones."""
    records = read_topic(kafka, w.marker)
    return Counter(orjson.loads(r[3])["batch"] for r in records)


@pytest.mark.parametrize("batches", [1, 4])
def test_two_replicas_writing_at_once_commit_each_batch_once(kafka: str, uid: str, batches: int):
    """Both replicas' writers write the same batches at the same moment (the first one
    included): whichever producer was initialised last commits, the other one is fenced,
    follows, and skips what the marker shows."""
    topic = f"kso-{uid}"
    create_topic(kafka, topic)
    writers = [writer("kafka", kafka, topic, f"ksb-{uid}") for _ in range(2)]
    assert write_in_step(writers, [ArrowBatch(i) for i in range(batches)]) == []
    assert _ids(kafka, topic) == Counter(range(100 * batches))
    assert _marked(kafka, writers[0]) == Counter(range(batches))


def test_the_follower_takes_over_when_the_writer_dies_inside_a_transaction(
    kafka: str, uid: str, tmp_path: Path
) -> None:
    """Replica B writes batch 0; replica A starts (its producer fences B's), commits
    batches 0 to 3 (0 found committed) and is SIGKILLed with batch 4's transaction open.
    B, fenced at batch 1, follows the marker through batch 3, waits for batch 4 in vain,
    takes over — its producer aborts A's open transaction — and writes batch 4 once."""
    topic, pipeline = f"kto-{uid}", f"kst-{uid}"
    create_topic(kafka, topic)
    b = writer("kafka", kafka, topic, pipeline)
    b.write(ArrowBatch(0), 0)  # type: ignore[arg-type]
    faults = tmp_path / "faults"
    faults.mkdir()
    a = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.sink_replica", "kafka", kafka, topic, pipeline,
         "5", str(faults)],
        cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (faults / "kafka-sink-open-transaction.reached").exists(), timeout=90)
    finally:
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(10)
    for batch_id in (1, 2, 3):
        b.write(ArrowBatch(batch_id), batch_id)  # type: ignore[arg-type]
    started = time.monotonic()
    b.write(ArrowBatch(4), 4)  # type: ignore[arg-type]
    took = time.monotonic() - started
    b.close()
    print(f"the follower wrote the dead writer's batch {took:.1f} s after it began waiting")
    assert _ids(kafka, topic) == Counter(range(500))
    assert _marked(kafka, b) == Counter(range(5))
    # A's batch 4 reached the broker and was aborted: the kill landed inside it.
    assert _ids(kafka, topic, isolation="read_uncommitted")[450] == 2
    assert TAKEOVER_AFTER <= took < TAKEOVER_AFTER + 10


def test_a_produce_refused_for_the_fatal_error_of_a_fencing_counts_as_fenced() -> None:
    """Once librdkafka's thread has seen the producer fenced, produce() raises a
    KafkaError ``_FATAL`` whose ``fatal()`` is False (CI saw one in
    ``test_two_replicas_writing_at_once_commit_each_batch_once``): the replica follows,
    as when the commit is fenced."""
    from confluent_kafka import KafkaError, KafkaException

    assert _fenced(KafkaException(KafkaError(KafkaError._FATAL)))
    assert _fenced(KafkaException(KafkaError(KafkaError._FENCED)))
    assert not _fenced(KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT)))
    assert not _fenced(ValueError("not Kafka's"))


def test_a_writer_fenced_outside_standby_still_fails(kafka: str, uid: str) -> None:
    """Without standby a second producer with the sink's transactional id is a zombie's
    successor (or a misconfiguration): the fenced writer's batch fails, as before."""
    topic = f"kfo-{uid}"
    create_topic(kafka, topic)
    alone: Any = writer("kafka", kafka, topic, f"kfa-{uid}")
    alone.ctx = dataclasses.replace(alone.ctx, replicated=False)
    alone.write(ArrowBatch(0), 0)
    successor = writer("kafka", kafka, topic, f"kfa-{uid}")
    successor.write(ArrowBatch(1), 1)
    with pytest.raises(Exception, match=r"(?i)fenc|epoch"):
        alone.write(ArrowBatch(2), 2)
    alone.close()
    successor.close()
