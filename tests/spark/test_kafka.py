"""The Kafka connector against a real Kafka-wire broker (Tansu): exact output,
per-key order, dead letters and clear errors."""

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


def test_kafka_to_kafka_exact_output_in_key_order(spark, nats_url, kafka, checkpoints, uid):
    src, out = f"in-{uid}", f"out-{uid}"
    create_topic(kafka, src, partitions=3)
    create_topic(kafka, out, partitions=2)
    records = [{"device": DEVICES[i % 4], "n": i, "v": i * 1.5} for i in range(60)]
    produce(kafka, src, records, key="device")
    produce(kafka, src, [b"not json", b'{"device": "a", "n": "x", "v": 1}'], key=None)
    flow = (
        sf.Pipeline(f"k-{uid}", trigger="0.5s")
        .source_kafka(src, bootstrap=kafka, key="device",
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
sinks:
  - {id: out, type: kafka, topic: "bad topic", bootstrap: "localhost:9092"}
"""
    with pytest.raises(PipelineFileError) as info:
        load_pipeline_text(text, "k.yaml")
    assert "k.yaml:4: sources[0].bootstrap: Field required" in str(info.value)
    assert "k.yaml:6: sinks[0].topic: String should match pattern" in str(info.value)
