"""The Kafka connector against Apache Kafka: exact output, per-key order, dead letters
and clear errors, with either source reader (Spark's own connector, the default, and
spanflow's Python reader on confluent-kafka)."""

from __future__ import annotations

import socket
from collections import defaultdict

import orjson
import pytest

import spanflow as sf
from spanflow.api import load_pipeline_text
from spanflow.errors import CompileError, PipelineFileError
from spanflow.spark.runner import PipelineRunner
from tests.helpers import read_all, wait_for
from tests.kafka_helpers import create_topic, produce, read_topic

DEVICES = ("a", "b", "c", "d")


READERS = pytest.mark.parametrize("reader", ["spark", "python"])


@READERS
def test_kafka_to_kafka_exact_output_in_key_order(spark, nats_url, kafka, checkpoints, uid, reader):
    src, out = f"in-{uid}", f"out-{uid}"
    create_topic(kafka, src, partitions=3)
    create_topic(kafka, out, partitions=2)
    records = [{"device": DEVICES[i % 4], "n": i, "v": i * 1.5} for i in range(60)]
    produce(kafka, src, records, key="device")
    produce(kafka, src, [b"not json", b'{"device": "a", "n": "x", "v": 1}'], key=None)
    flow = (
        sf.Pipeline(f"k-{uid}", trigger="0.5s")
        .source_kafka(src, bootstrap=kafka, key="device", reader=reader,
                      schema={"device": "string", "n": "long", "v": "double"})
        .filter("n % 3 != 0")
        .map(double="v * 2", partition="_partition", kafka_key="_key")
        .sink_kafka(out, bootstrap=kafka, key="device", headers=["n"])
    )  # fmt: skip
    expected = [r for r in records if r["n"] % 3 != 0]
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        wait_for(lambda: len(read_topic(kafka, out)) >= len(expected))
        runner.await_idle()
    finally:
        runner.stop()
    got = read_topic(kafka, out)
    values = [orjson.loads(v) for _, _, _, v, _ in got]
    assert sorted(v["n"] for v in values) == [r["n"] for r in expected]
    assert all(v["double"] == v["v"] * 2 and v["kafka_key"] == v["device"] for v in values)
    # every record of a device went through one partition each way, in order
    by_device: dict[str, list[int]] = defaultdict(list)
    partitions = defaultdict(set)
    for p, _, key, value, headers in sorted(got, key=lambda g: (g[0], g[1])):
        record = orjson.loads(value)
        assert key == record["device"].encode()
        assert headers == [("n", str(record["n"]).encode())]
        by_device[record["device"]].append(record["n"])
        partitions[record["device"]].add(p)
    assert all(len(ps) == 1 for ps in partitions.values())
    assert all(ns == sorted(ns) for ns in by_device.values())
    letters = [(h, d) for h, d, s in read_all(nats_url, "SPANFLOW_DLQ") if f"k-{uid}" in s]
    assert sorted(d for _, d in letters) == sorted(
        [b'{"device": "a", "n": "x", "v": 1}', b"not json"]
    )
    reasons = {h["Spanflow-Reason"].split(":")[0] for h, _ in letters}
    assert reasons == {"not valid json", "field 'n'"}


def test_a_missing_topic_or_an_unreachable_broker_is_one_clear_error_at_start(
    spark, nats_url, kafka, checkpoints, uid
):
    schema = {"device": "string"}
    missing = (
        sf.Pipeline(f"km-{uid}")
        .source_kafka(f"nope-{uid}", bootstrap=kafka, schema=schema)
        .sink_console()
    )
    with pytest.raises(CompileError, match=rf"topic 'nope-{uid}' does not exist"):
        PipelineRunner(spark, missing.spec(), nats_url=nats_url, checkpoint_dir=checkpoints).start()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    create_topic(kafka, f"there-{uid}")
    unreachable = (
        sf.Pipeline(f"ku-{uid}")
        .source_kafka(f"there-{uid}", bootstrap=kafka, schema=schema)
        .sink_kafka(f"there-{uid}", bootstrap=dead)
    )
    runner = PipelineRunner(
        spark, unreachable.spec(), nats_url=nats_url, checkpoint_dir=checkpoints
    )
    with pytest.raises(CompileError, match=rf"kafka brokers unreachable \({dead}\)"):
        runner.start()
    assert not spark.streams.active or all(
        q.name is None or f"ku-{uid}" not in q.name for q in spark.streams.active
    )


def test_kafka_options_are_checked_where_they_are_written():
    text = """
name: k
sources:
  - {id: in, type: kafka, topic: t, schema: {a: long}, to: [out]}
  - {id: sasl, type: kafka, topic: t, bootstrap: "h:9092", schema: {a: long}, to: [out],
     reader: spark,
     config: {security.protocol: SASL_SSL}}
sinks:
  - {id: out, type: kafka, topic: "bad topic", bootstrap: "localhost:9092"}
"""
    with pytest.raises(PipelineFileError) as info:
        load_pipeline_text(text, "k.yaml")
    assert "k.yaml:4: sources[0].bootstrap: Field required" in str(info.value)
    assert "k.yaml:9: sinks[0].topic: String should match pattern" in str(info.value)
    # librdkafka settings are the Python reader's: the message says how to use them
    assert "k.yaml:5: sources[1]" in str(info.value)
    assert "set reader: python" in str(info.value)


AVRO = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "device", "type": "string"},
        {"name": "t", "type": ["null", "double"]},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def _avro(record: dict, schema_id: int | None) -> bytes:
    import io

    import fastavro

    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(AVRO), record)
    body = buffer.getvalue()
    return body if schema_id is None else b"\x00" + schema_id.to_bytes(4, "big") + body


@READERS
def test_avro_in_confluent_wire_format_is_read_and_bad_records_dead_lettered(
    spark, nats_url, kafka, checkpoints, uid, tmp_path, reader
):
    from datetime import UTC, datetime

    src, out = f"avro-{uid}", f"avro-out-{uid}"
    create_topic(kafka, src, partitions=2)
    create_topic(kafka, out)
    base = datetime(2026, 11, 25, tzinfo=UTC)
    good = [
        {"device": "ab"[i % 2], "t": None if i == 3 else 20.0 + i,
         "ts": base.replace(second=i)}
        for i in range(12)
    ]  # fmt: skip
    bad = [_avro(good[0], None), b"\x00\x00\x00\x00\x07\xff\xff", b"{not avro}"]
    produce(kafka, src, [_avro(r, 7) for r in good] + bad)
    (tmp_path / "reading.avsc").write_text(orjson.dumps(AVRO).decode())
    spec = load_pipeline_text(
        f"""
name: av-{uid}
trigger: 0.5s
sources:
  - {{id: readings, type: kafka, topic: {src}, bootstrap: "{kafka}", format: avro,
     avro_schema: reading.avsc, avro_framing: confluent, event_time: ts, reader: {reader},
     to: [out]}}
sinks:
  - {{id: out, type: kafka, topic: {out}, bootstrap: "{kafka}", key: device}}
""",
        str(tmp_path / "pipeline.yaml"),
    )
    assert spec.sources()[0].schema_ == {"device": "string", "t": "double?", "ts": "timestamp"}
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        wait_for(lambda: len(read_topic(kafka, out)) >= len(good))
        wait_for(lambda: len(_letters(nats_url, f"av-{uid}")) >= len(bad))
        runner.await_idle()
    finally:
        runner.stop()
    got = sorted(
        (orjson.loads(v) for _, _, _, v, _ in read_topic(kafka, out)), key=lambda r: r["ts"]
    )
    assert [(r["device"], r["t"]) for r in got] == [(r["device"], r["t"]) for r in good]
    assert got[5]["ts"].startswith("2026-11-25T00:00:05")
    reasons = sorted(h["Spanflow-Reason"] for h, _ in _letters(nats_url, f"av-{uid}"))
    assert len(reasons) == 3 and all(r.startswith("not valid avro") for r in reasons)
    assert sum("Confluent" in r for r in reasons) == 2


def _letters(nats_url: str, pipeline: str) -> list:
    return [(h, d) for h, d, s in read_all(nats_url, "SPANFLOW_DLQ") if pipeline in s]
