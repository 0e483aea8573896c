"""Joins on real Spark and JetStream: interval joins (inner, left) and enrichment from a
live key-value bucket and from a file."""

from __future__ import annotations

from datetime import datetime

import pytest

import spanflow as sf
from spanflow.errors import CompileError, SpecError
from spanflow.spark.runner import PipelineRunner
from tests.helpers import kv_apply, publish, read_all, read_records, supervising, wait_for

BASE = 1_800_000_000
TEMP = {"device": "string", "ts": "timestamp", "temp": "double"}
PRES = {"device": "string", "ts": "timestamp", "pressure": "double"}


def _secs(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _join_flow(uid: str, how: str) -> sf.Flow:
    p = sf.Pipeline(f"join-{how}-{uid}", trigger=0)
    temps = p.source(f"T_{uid}", schema=TEMP, event_time="ts", max_out_of_orderness="1s")
    pressures = p.source(f"P_{uid}", schema=PRES, event_time="ts", max_out_of_orderness="1s")
    return temps.join(pressures, on="device", within=("-5s", "+5s"), how=how).sink_jetstream(
        f"OUT_{uid}", subject=f"out{uid}"
    )


TEMPS = [("a", 0, 20.0), ("a", 30, 21.0), ("b", 10, 30.0), ("c", 50, 40.0)]
PRESSURES = [("a", 3, 1.0), ("a", -4, 1.1), ("a", 36, 1.2), ("b", 20, 2.0), ("c", 54, 3.0)]


def _publish_join_inputs(nats_url: str, uid: str) -> None:
    flush = [{"device": "z", "ts": BASE + 1000, "temp": 0.0}]
    publish(
        nats_url,
        f"T_{uid}",
        f"t{uid}.r",
        [{"device": d, "ts": BASE + t, "temp": v} for d, t, v in TEMPS] + flush,
    )
    publish(
        nats_url,
        f"P_{uid}",
        f"p{uid}.r",
        [{"device": d, "ts": BASE + t, "pressure": v} for d, t, v in PRESSURES]
        + [{"device": "z", "ts": BASE + 1000, "pressure": 0.0}],
    )


def _oracle(how: str) -> list[tuple]:
    out = []
    for d, t, v in TEMPS:
        matches = [(pt, pv) for pd, pt, pv in PRESSURES if pd == d and -5 <= pt - t <= 5]
        out += [(d, t, v, pt, pv) for pt, pv in matches]
        if how == "left" and not matches:
            out.append((d, t, v, None, None))
    return sorted(out, key=str)


@pytest.mark.parametrize("how", ["inner", "left"])
def test_interval_join_matches_the_oracle(spark, nats_url, checkpoints, uid, how):
    _publish_join_inputs(nats_url, uid)
    flow = _join_flow(uid, how)
    expected = _oracle(how)
    z_pairs = 1  # the flush records of z join each other
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        with supervising(runner):
            wait_for(lambda: len(read_all(nats_url, f"OUT_{uid}")) >= len(expected) + z_pairs)
            runner.await_idle()
    finally:
        runner.stop()
    got = [
        (
            r["device"],
            _secs(r["ts"]) - BASE,
            r["temp"],
            None if r["ts_right"] is None else _secs(r["ts_right"]) - BASE,
            r["pressure"],
        )
        for r in read_records(nats_url, f"OUT_{uid}")
        if r["device"] != "z"
    ]
    assert sorted(got, key=str) == expected


def test_enrichment_from_a_live_bucket_applies_changes_to_later_records(
    spark, nats_url, checkpoints, uid
):
    bucket, stream, out = f"DEV_{uid}", f"IN_{uid}", f"OUT_{uid}"
    schema = {"device": "string", "ts": "timestamp", "v": "double", "site": "string"}
    flow = (
        sf.Pipeline(f"enrich-{uid}", trigger="200ms")
        .source(stream, schema=schema)
        .enrich(f"kv:{bucket}", on="device", schema={"site": "string", "owner": "string"})
        .sink_jetstream(out, subject=f"out{uid}")
    )
    kv_apply(nats_url, bucket, {"a": {"site": "north", "owner": "ann"}, "b": {"owner": "bob"}})

    def send(n: int, device: str) -> None:
        publish(
            nats_url,
            stream,
            f"in{uid}.r",
            [{"device": device, "ts": BASE, "v": float(n), "site": "here"}],
        )

    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        send(1, "a")
        send(2, "b")
        send(3, "c")  # no row: left join keeps it with nulls
        wait_for(lambda: len(read_all(nats_url, out)) >= 3)
        kv_apply(nats_url, bucket, {"a": {"site": "south", "owner": "amy"}, "b": None})
        send(4, "a")
        send(5, "b")
        wait_for(lambda: len(read_all(nats_url, out)) >= 5)
    finally:
        runner.stop()
    got = {
        r["v"]: (r["device"], r["site"], r["site_table"], r["owner"])
        for r in read_records(nats_url, out)
    }
    assert got == {
        1.0: ("a", "here", "north", "ann"),
        2.0: ("b", "here", None, "bob"),
        3.0: ("c", "here", None, None),
        4.0: ("a", "here", "south", "amy"),  # the update applies to later records
        5.0: ("b", "here", None, None),  # the delete too
    }


def test_enrichment_from_a_csv_file_inner_drops_unknown_keys(
    spark, nats_url, checkpoints, uid, tmp_path
):
    table = tmp_path / "devices.csv"
    table.write_text("device,site,floor\na,north,1\nb,south,2\n")
    stream, out = f"IN_{uid}", f"OUT_{uid}"
    flow = (
        sf.Pipeline(f"file-{uid}", trigger=0)
        .source(stream, schema={"device": "string", "v": "double"})
        .enrich(
            f"file:{table}", on="device", schema={"site": "string", "floor": "long"}, how="inner"
        )
        .sink_jetstream(out, subject=f"out{uid}")
    )
    publish(
        nats_url,
        stream,
        f"in{uid}.r",
        [{"device": d, "v": float(i)} for i, d in enumerate("abcab")],
    )
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        wait_for(lambda: len(read_all(nats_url, out)) >= 4)
        runner.await_idle()
    finally:
        runner.stop()
    got = sorted((r["v"], r["device"], r["site"], r["floor"]) for r in read_records(nats_url, out))
    assert got == [
        (0.0, "a", "north", 1),
        (1.0, "b", "south", 2),
        (3.0, "a", "north", 1),
        (4.0, "b", "south", 2),
    ]


def test_a_join_on_a_missing_field_names_the_step(spark, nats_url):
    from spanflow.spark.compile.pipeline import compile_pipeline

    p = sf.Pipeline("bad-join")
    a = p.source("A", schema=TEMP, event_time="ts")
    b = p.source("B", schema={"sensor": "string", "ts": "timestamp"}, event_time="ts")
    flow = a.join(b, on="device", within="5s", id="j").sink_console()
    with pytest.raises(CompileError, match=r"step 'j': unknown join field\(s\) \['device'\]"):
        compile_pipeline(spark, flow.spec(), nats_url=nats_url)


def test_an_interval_join_without_event_time_is_refused_at_validation():
    p = sf.Pipeline("no-time")
    a = p.source("A", schema=TEMP, event_time="ts")
    b = p.source("B", schema=PRES)
    with pytest.raises(SpecError, match=r"join .j.: the right input .* has no event time"):
        a.join(b, on="device", within="5s", id="j").sink_console().spec()


def test_table_versions_apply_to_the_records_stored_after_them():
    from datetime import UTC, timedelta

    from spanflow.spark.keyed.builtins import TableLookup
    from spanflow.testing import KeyedProcessorTest

    t0 = datetime(2027, 1, 1, tzinfo=UTC)

    def row(at: float, entry: dict | None = None, v: float | None = None) -> dict:
        table = v is None
        return {
            "_join": "a",
            "_at": t0 + timedelta(seconds=at),
            "_table": table,
            "_entry": entry if table else None,
            "_event": None if table else {"v": v},
        }

    t = KeyedProcessorTest(
        TableLookup,
        key="_join",
        output_schema={"v": "double", "level": "long?"},
        params={"fields": {"level": "level"}, "inner": False},
    )
    # The table's stream runs ahead: both changes come before the records around them.
    assert t.process([row(10, {"level": 2}), row(20, {"level": 3})]) == []
    out = t.process([row(5, v=1.0), row(15, v=2.0), row(25, v=3.0)])
    # 5 s predates every change still known: it sees the oldest one.
    assert out == [{"v": 1.0, "level": 2}, {"v": 2.0, "level": 2}, {"v": 3.0, "level": 3}]
    assert t.process([row(30, {"level": None}), row(31, v=4.0)]) == [{"v": 4.0, "level": None}]
