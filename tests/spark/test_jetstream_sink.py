"""The micro-batch JetStream sink in the JVM (spark/connectors/jetstream/sink.py, BatchSink.java):
what it publishes, in which order and under which subjects, and that a replayed
batch repeats its message ids exactly."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

from spanflow.nats.streams import connect, ensure_stream
from spanflow.spark.connectors.jetstream.sink import JetStreamSink, SinkTarget, publish_batch
from tests.helpers import read_all


def _stream(url: str, name: str, subjects: str) -> None:
    async def go() -> None:
        nc = await connect(url)
        await ensure_stream(nc.jetstream(), name, [subjects])
        await nc.close()

    asyncio.run(go())


def _batch(spark):  # type: ignore[no-untyped-def]
    rows = [
        ("b", 2, 1.5, True, datetime(2027, 1, 1, 0, 0, 1, 500000, tzinfo=UTC)),
        ("a", None, None, False, datetime(2027, 1, 1, 0, 0, 2, tzinfo=UTC)),
        ("a", 1, 2.0, None, datetime(2027, 1, 1, 0, 0, 3, tzinfo=UTC)),
        ("a", 1, 2.0, None, datetime(2027, 1, 1, 0, 0, 3, tzinfo=UTC)),  # twice: 2 outputs
    ]
    schema = "device string, n long, v double, ok boolean, _published timestamp"
    return spark.createDataFrame(rows, schema)


def test_rows_are_published_in_order_under_their_subjects_once_per_replay(
    spark, nats_url, uid
) -> None:
    stream, prefix = f"BSINK_{uid}", f"bsink{uid}"
    _stream(nats_url, stream, f"{prefix}.>")
    target = SinkTarget(pipeline="p", step="out", subject=prefix + ".{device}.{ok}", order_by="n")
    sink = JetStreamSink(spark, target, nats_url, epoch=3)
    try:
        encoded = sink.encode(_batch(spark), 7)
        assert encoded.size == 4
        assert (
            sorted(encoded.born_seconds().tolist())[0]
            == datetime(2027, 1, 1, 0, 0, 1, 500000, tzinfo=UTC).timestamp()
        )
        first = publish_batch(sink, encoded, set())
        assert (first.sent, first.duplicates) == (4, 0)
        # a replay of the batch: the same ids, every message a duplicate
        again = publish_batch(sink, sink.encode(_batch(spark), 7), set())
        assert (again.sent, again.duplicates) == (4, 4)
        assert again.last_seq == first.last_seq
        # what the ledger names as stored is not sent at all
        skipped = publish_batch(sink, encoded, set(encoded.ids()[:3]))
        assert skipped.sent == 1
    finally:
        sink.close()
    stored = read_all(nats_url, stream)
    assert len(stored) == 4
    payloads = [json.loads(data) for _, data, _ in stored]
    assert [p["n"] for p in payloads] == [1, 1, 2, None]  # ordered by n, nulls last
    assert payloads[-1] == {"device": "a", "n": None, "v": None, "ok": False}  # no _columns
    subjects = [subject for _, _, subject in stored]
    assert subjects == [f"{prefix}.a._", f"{prefix}.a._", f"{prefix}.b.True", f"{prefix}.a.False"]
    ids = [headers["Nats-Msg-Id"] for headers, _, _ in stored if headers]
    assert len(set(ids)) == 4 and all(i.startswith("p:out:7:driver:") for i in ids)
    assert sorted(i.rsplit(":", 1)[1] for i in ids) == ["0", "0", "0", "1"]  # equal rows counted
    assert {headers["Spanflow-Epoch"] for headers, _, _ in stored if headers} == {"3"}


def test_timestamps_are_published_as_utc_iso_strings(spark, nats_url, uid) -> None:
    stream, subject = f"BSTS_{uid}", f"bsts{uid}"
    _stream(nats_url, stream, subject)
    sink = JetStreamSink(spark, SinkTarget("p", "ts", subject), nats_url, epoch=None)
    try:
        df = spark.createDataFrame(
            [
                (datetime(2027, 1, 1, 12, 0, 0, tzinfo=UTC),),
                (datetime(2027, 1, 1, 12, 0, 0, 250000, tzinfo=UTC),),
            ],
            "at timestamp",
        )
        publish_batch(sink, sink.encode(df, 0), set())
    finally:
        sink.close()
    got = sorted(json.loads(data)["at"] for _, data, _ in read_all(nats_url, stream))
    assert got == ["2027-01-01T12:00:00.250000Z", "2027-01-01T12:00:00Z"]
