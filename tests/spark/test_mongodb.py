"""The MongoDB sink against a MongoDB wire-protocol server: nx-27017, an EMULATOR on
SQLite (no real mongod installs on these machines). Exact documents, upserts of
window updates by key, exactly once across a SIGKILL, clear start errors."""

from __future__ import annotations

import socket
from datetime import UTC

import pymongo
import pytest

import spanflow as sf
from spanflow.errors import CompileError
from spanflow.spark.runner import PipelineRunner
from tests.helpers import wait_for
from tests.spark import sink_cases

SCHEMA = sink_cases.SCHEMA


def docs(uri: str, database: str, collection: str) -> list[dict]:
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as client:
        return list(client[database][collection].find())


def test_documents_inserted_and_window_updates_upserted(spark, nats_url, mongodb, checkpoints, uid):
    records, readings = sink_cases.readings(uid, "mg")
    plain = readings.filter("id % 4 != 0").sink_mongodb("rows", uri=mongodb, database=uid)
    windows = sink_cases.windows_of(readings).sink_mongodb(
        "windows", uri=mongodb, database=uid, key=["device", "window_start"]
    )
    runner = PipelineRunner(
        spark, plain.merge(windows).spec(), nats_url=nats_url, checkpoint_dir=checkpoints
    ).start()
    try:
        sink_cases.publish_readings(nats_url, uid, "mg", records[:20])
        wait_for(lambda: len(docs(mongodb, uid, "rows")) >= 15)
        sink_cases.publish_readings(nats_url, uid, "mg", records[20:])
        wait_for(lambda: sum(d["n"] for d in docs(mongodb, uid, "windows")) >= len(records))
        wait_for(lambda: len(docs(mongodb, uid, "rows")) >= 30)
        runner.await_idle()
    finally:
        runner.stop()
    rows = docs(mongodb, uid, "rows")
    assert sorted(d["id"] for d in rows) == [r["id"] for r in records if r["id"] % 4]
    got = {  # pymongo gives naive UTC datetimes
        (d["device"], int(d["window_start"].replace(tzinfo=UTC).timestamp())): (d["n"], d["total"])
        for d in docs(mongodb, uid, "windows")
    }
    assert got == sink_cases.expected_windows(records)


def test_an_unreachable_server_is_one_clear_error_at_start(spark, nats_url, checkpoints, uid):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"mongodb://127.0.0.1:{s.getsockname()[1]}/"
    flow = (
        sf.Pipeline(f"mge-{uid}")
        .source(f"MGE_{uid}", subjects=[f"mge{uid}"], schema=SCHEMA)
        .sink_mongodb("c", uri=dead, database="d", timeout=2)
    )
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    with pytest.raises(CompileError, match=rf"mongodb \({dead}\): .*refused"):
        runner.start()


def test_documents_the_server_refuses_are_dead_lettered_and_the_others_written(
    spark, nats_url, mongodb, checkpoints, uid
):
    import orjson

    from tests.helpers import read_all

    with pymongo.MongoClient(mongodb, serverSelectionTimeoutMS=5000) as client:
        client[uid]["serials"].create_index("serial", unique=True)
    records = [{"id": i, "serial": f"s{i % 4}"} for i in range(6)]  # ids 4 and 5 repeat serials
    flow = (
        sf.Pipeline(f"mgr-{uid}", trigger="0.3s")
        .source(f"MGR_{uid}", subjects=[f"mgr{uid}.>"], schema={"id": "long", "serial": "string"})
        .sink_mongodb("serials", uri=mongodb, database=uid, key="id")
    )
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()

    def letters() -> list:
        return [(h, d) for h, d, s in read_all(nats_url, "SPANFLOW_DLQ") if f"mgr-{uid}" in s]

    try:
        sink_cases.publish_readings(nats_url, uid, "mgr", records)
        wait_for(lambda: len(docs(mongodb, uid, "serials")) >= 4 and len(letters()) >= 2)
        runner.await_idle()
    finally:
        runner.stop()
    written = docs(mongodb, uid, "serials")
    refused = [orjson.loads(d)["id"] for _, d in letters()]
    # one document per serial; each of the others refused, none lost or doubled
    assert sorted(d["serial"] for d in written) == ["s0", "s1", "s2", "s3"]
    assert sorted([d["id"] for d in written] + refused) == list(range(6))
    assert all(h["Spanflow-Reason"].startswith("mongodb: ") for h, _ in letters())
