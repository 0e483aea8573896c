"""Late records go to the dead letters (reason ``late``), counted, and leave the windows
they missed as they were written; ``allowed_lateness`` keeps windows open longer."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

import spanflow as sf
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, read_records, wait_for

T0 = 1_800_000_000  # on a 10-second boundary
SCHEMA = {"id": "long", "ts": "timestamp"}


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat()


def _windows(nats_url: str, stream: str) -> dict[float, list[int]]:
    out: dict[float, list[int]] = {}
    for r in read_records(nats_url, stream):
        start = datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp()
        out.setdefault(start - T0, []).append(r["n"])
    return out


def _late_letters(nats_url: str, pipeline: str) -> list[tuple[bytes, str]]:
    return [
        (data, subject)
        for _, data, subject in read_all(nats_url, "SPANFLOW_DLQ")
        if subject.startswith(f"spanflow.dlq.{pipeline}.")
    ]


def test_a_late_record_is_dead_lettered_and_its_window_unchanged(spark, nats_url, checkpoints, uid):
    """Windows of 10 s waiting 10 s beyond the watermark (allowed_lateness), no
    out-of-orderness: a record 12 s behind the newest is still counted while its window
    is open; one whose window was written is dead-lettered, and that window is not
    written again; a record behind the watermark whose window is open is counted."""
    name = f"late-{uid}"
    flow = (
        sf.Pipeline(name, trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, event_time="ts")
        .window(tumbling="10s", allowed_lateness="10s")
        .aggregate(n="count", ids="sum(id)")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    spec = flow.spec()
    subject = f"in{uid}.r"
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        # 1: the watermark moves to 17 - 10 = 7: nothing is written yet
        publish(nats_url, f"IN_{uid}", subject, [{"id": 1, "ts": _at(1)}, {"id": 2, "ts": _at(3)}])
        publish(nats_url, f"IN_{uid}", subject, [{"id": 4, "ts": _at(17)}])
        runner.await_idle()
        # 2: 5 s is behind the newest by 12 s, but its window is open (allowed lateness);
        # 31 moves the watermark to 21: [0, 10) and [10, 20) are written
        publish(
            nats_url, f"IN_{uid}", subject, [{"id": 8, "ts": _at(5)}, {"id": 16, "ts": _at(31)}]
        )
        wait_for(lambda: {0.0, 10.0} <= set(_windows(nats_url, f"OUT_{uid}")))
        # 3: 8 s is late ([0, 10) was written); 26 s is behind the watermark (21) but
        # [20, 30) is open, so it counts; 55 (watermark 45) writes [20, 30) and [30, 40)
        late = {"id": 32, "ts": _at(8)}
        publish(nats_url, f"IN_{uid}", subject, [late, {"id": 64, "ts": _at(26)}])
        publish(nats_url, f"IN_{uid}", subject, [{"id": 128, "ts": _at(55)}])
        wait_for(lambda: {20.0, 30.0} <= set(_windows(nats_url, f"OUT_{uid}")))
        wait_for(lambda: _late_letters(nats_url, name))
        runner.await_idle()
        dead, late_count = runner.dead_letters(), runner.late_records()
    finally:
        runner.stop()
    windows = _windows(nats_url, f"OUT_{uid}")
    assert windows == {0.0: [3], 10.0: [1], 20.0: [1], 30.0: [1]}
    ids = {
        datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp() - T0: r["ids"]
        for r in read_records(nats_url, f"OUT_{uid}")
    }
    assert ids == {0.0: 1 + 2 + 8, 10.0: 4, 20.0: 64, 30.0: 16}
    letters = _late_letters(nats_url, name)
    assert len(letters) == 1
    data, subject_of = letters[0]
    assert subject_of == f"spanflow.dlq.{spec.instance}.{spec.sources()[0].id}.late"
    assert b'"id":32' in data.replace(b" ", b"")
    assert dead == 1 and late_count == 1


def test_late_kafka_records_are_dead_lettered_by_the_python_reader(
    spark, nats_url, kafka, checkpoints, uid
):
    from tests.kafka_helpers import create_topic, produce

    name, topic = f"klate-{uid}", f"late-{uid}"
    create_topic(kafka, topic, partitions=2)
    flow = (
        sf.Pipeline(name, trigger=0)
        .source_kafka(topic, bootstrap=kafka, schema=SCHEMA, event_time="ts")  # Python reader
        .window(tumbling="10s")
        .aggregate(n="count", ids="sum(id)")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        produce(kafka, topic, [{"id": 1, "ts": _at(1)}, {"id": 2, "ts": _at(25)}], key="id")
        wait_for(lambda: 0.0 in _windows(nats_url, f"OUT_{uid}"))
        produce(kafka, topic, [{"id": 4, "ts": _at(5)}, {"id": 8, "ts": _at(40)}], key="id")
        wait_for(lambda: 20.0 in _windows(nats_url, f"OUT_{uid}"))
        wait_for(lambda: _late_letters(nats_url, name))
        runner.await_idle()
    finally:
        runner.stop()
    ids = {
        datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp() - T0: r["ids"]
        for r in read_records(nats_url, f"OUT_{uid}")
    }
    assert ids == {0.0: 1, 20.0: 2}
    ((data, subject),) = _late_letters(nats_url, name)
    assert subject.endswith(".late") and orjson.loads(data)["id"] == 4
