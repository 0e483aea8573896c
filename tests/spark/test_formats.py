"""Decoders for every stream format, and what they reject (no Spark needed)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spanflow.protocol.raw import RawRecord
from spanflow.spark.formats import Decoder
from spanflow.spec.schema import StreamFormat

SCHEMA = {
    "device": "string",
    "temp": "double",
    "n": "long",
    "ok": "boolean",
    "ts": "timestamp",
    "note": "string?",
}
TS = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def _msgs(*payloads: bytes) -> list[RawRecord]:
    return [RawRecord(i + 1, "s.x", p, 1_000_000) for i, p in enumerate(payloads)]


@pytest.mark.parametrize(
    ("fmt", "payload"),
    [
        (
            StreamFormat.JSON,
            b'{"device": "d1", "temp": 21.5, "n": 3, "ok": true, "ts": "2026-05-01T12:00:00Z"}',
        ),
        (
            StreamFormat.YAML,
            b"device: d1\ntemp: 21.5\nn: 3\nok: true\nts: '2026-05-01T12:00:00+00:00'\n",
        ),
        (
            StreamFormat.TOML,
            b'device = "d1"\ntemp = 21.5\nn = 3\nok = true\nts = 2026-05-01T12:00:00Z\n',
        ),
        (StreamFormat.CSV, b"d1,21.5,3,true,2026-05-01T12:00:00Z,"),
    ],
)
def test_each_format_decodes_to_the_same_row(fmt, payload):
    batch, rejects = Decoder(fmt, SCHEMA).decode(_msgs(payload))
    assert rejects == []
    row = batch.to_pylist()[0]
    assert (row["device"], row["temp"], row["n"], row["ok"], row["note"]) == (
        "d1",
        21.5,
        3,
        True,
        None,
    )
    assert row["ts"] == TS
    assert row["_seq"] == 1 and row["_subject"] == "s.x"


def test_epoch_seconds_and_milliseconds_both_mean_the_same_time():
    d = Decoder(StreamFormat.JSON, {"ts": "timestamp"})
    batch, _ = d.decode(
        _msgs(b'{"ts": %d}' % TS.timestamp(), b'{"ts": %d}' % (TS.timestamp() * 1000))
    )
    assert [r["ts"] for r in batch.to_pylist()] == [TS, TS]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"device": "d1", "temp": ', "not valid json"),
        (b'["a list"]', "expected a json object"),
        (
            b'{"device": "d1", "n": 1, "ok": true, "ts": 1}',
            "field 'temp': required field is missing",
        ),
        (
            b'{"device": "d1", "temp": "hot", "n": 1, "ok": true, "ts": 1}',
            "field 'temp': expected number",
        ),
        (
            b'{"device": 7, "temp": 1, "n": 1, "ok": true, "ts": 1}',
            "field 'device': expected string",
        ),
        (
            b'{"device": "d", "temp": 1, "n": 1.5, "ok": true, "ts": 1}',
            "field 'n': expected integer",
        ),
        (
            b'{"device": "d", "temp": 1, "n": 1, "ok": true, "ts": "yesterday"}',
            "field 'ts': expected ISO-8601",
        ),
    ],
)
def test_bad_messages_are_rejected_with_a_reason_and_good_ones_kept(payload, reason):
    good = b'{"device": "d1", "temp": 1, "n": 1, "ok": false, "ts": 1}'
    batch, rejects = Decoder(StreamFormat.JSON, SCHEMA).decode(_msgs(good, payload, good))
    assert batch.num_rows == 2
    assert len(rejects) == 1 and rejects[0][0].data == payload
    assert reason in rejects[0][1]


def test_csv_with_wrong_column_count_is_rejected():
    _, rejects = Decoder(StreamFormat.CSV, {"a": "long", "b": "long"}).decode(_msgs(b"1,2,3"))
    assert "expected 2 CSV columns, got 3" in rejects[0][1]


def test_raw_keeps_bytes_untouched():
    batch, rejects = Decoder(StreamFormat.RAW, {}).decode(_msgs(b"\x00\xffbinary"))
    assert rejects == [] and batch.to_pylist()[0]["value"] == b"\x00\xffbinary"


@pytest.mark.parametrize("bad_rate", [0.0, 0.001, 0.05, 0.6])
def test_vectorised_json_path_gives_exactly_what_the_exact_path_gives(bad_rate):
    import random

    rng = random.Random(7)
    bad_kinds = [
        b"{broken",
        b"",
        b'{"device": 5, "temp": 1, "n": 1, "ok": true, "ts": 1}',
        b'{"device": "d", "temp": "1.5", "n": 1, "ok": true, "ts": "2026-05-01T12:00:00Z"}',
        b'{"device": "d",\n "temp": 1, "n": 1, "ok": true, "ts": "2026-05-01T12:00:00Z"}',
        b'{"device": "d", "n": 1, "ok": true, "ts": "2026-05-01T12:00:00Z"}',
        b"[1]",
    ]
    payloads = [
        rng.choice(bad_kinds)
        if rng.random() < bad_rate
        else b'{"device": "d%d", "temp": %d.5, "n": %d, "ok": false, "ts": "%s"}'
        % (i % 9, i % 40, i, b"2026-05-01T12:00:%02dZ" % (i % 60))
        for i in range(10_000)
    ]
    msgs = _msgs(*payloads)
    fast_batch, fast_rejects = Decoder(StreamFormat.JSON, SCHEMA).decode(msgs)
    exact_batch, exact_rejects = Decoder(StreamFormat.JSON, SCHEMA)._decode_exact(msgs)
    assert fast_batch.to_pylist() == exact_batch.to_pylist()
    assert [(m.seq, r) for m, r in fast_rejects] == [(m.seq, r) for m, r in exact_rejects]


def test_protobuf_messages_are_read_by_their_descriptors_and_bad_ones_dead_lettered(
    spark, nats_url, checkpoints, uid, tmp_path
):
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    from spanflow.api import load_pipeline_text
    from spanflow.spark.runner import PipelineRunner
    from tests.helpers import publish, read_all, read_records, wait_for

    proto = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="reading.proto", package="plant",
                                              syntax="proto3")  # fmt: skip
    message = file.message_type.add(name="Reading")
    for number, (name, kind) in enumerate(
        [("device", proto.TYPE_STRING), ("t", proto.TYPE_DOUBLE), ("n", proto.TYPE_INT64)], 1
    ):
        message.field.add(name=name, number=number, type=kind, label=proto.LABEL_OPTIONAL)
    (tmp_path / "reading.desc").write_bytes(
        descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString()
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    reading = message_factory.GetMessageClass(pool.FindMessageTypeByName("plant.Reading"))
    good = [reading(device=f"d{i}", t=20.5 + i, n=10**12 + i).SerializeToString() for i in range(5)]
    spec = load_pipeline_text(
        f"""
name: pb-{uid}
sources:
  - {{id: in, stream: PB_{uid}, subjects: ["pb{uid}.>"], format: protobuf,
     protobuf: {{message: plant.Reading, descriptors: reading.desc}},
     schema: {{device: string, t: double, n: long}}, to: [out]}}
sinks:
  - {{id: out, type: jetstream, stream: PBO_{uid}, subject: pbo{uid}}}
""",
        str(tmp_path / "p.yaml"),
    )
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        publish(nats_url, f"PB_{uid}", f"pb{uid}.r", [*good, b"\xff\xff\xff"])
        wait_for(lambda: len(read_records(nats_url, f"PBO_{uid}")) >= 5)
        runner.await_idle()
    finally:
        runner.stop()
    got = sorted((r["device"], r["t"], r["n"]) for r in read_records(nats_url, f"PBO_{uid}"))
    assert got == [(f"d{i}", 20.5 + i, 10**12 + i) for i in range(5)]
    letters = [(h, d) for h, d, s in read_all(nats_url, "SPANFLOW_DLQ") if f"pb-{uid}" in s]
    assert [d for _, d in letters] == [b"\xff\xff\xff"]
    assert letters[0][0]["Spanflow-Reason"].startswith("not valid protobuf")
