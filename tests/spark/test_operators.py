"""Operators on real Spark + JetStream, each checked against a plain-Python oracle."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from datetime import UTC, datetime

import pytest

import spanflow as sf
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, read_records, run_until, wait_for

BASE = 1_800_000_000
SCHEMA = {"id": "long", "device": "string", "v": "double", "ts": "timestamp"}


def fahrenheit(record):
    return {"id": record["id"], "device": record["device"], "f": record["v"] * 1.8 + 32}


def explode(record):
    return [{**record, "part": i} for i in range(record["id"] % 3)]


def fragile(record):
    if record["id"] % 10 == 0:
        raise ValueError(f"cannot handle id {record['id']}")
    return record


def keep_max(acc, record):
    return acc if acc["v"] >= record["v"] else record


def _data(n: int, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "id": i,
            "device": f"d{rng.randrange(3)}",
            "v": round(rng.uniform(0, 100), 2),
            "ts": BASE + i * 0.5 + rng.uniform(-1, 1),
        }
        for i in range(n)
    ]


def _start(wall: float) -> int:
    return (
        int(datetime.fromisoformat(wall).replace(tzinfo=UTC).timestamp())
        if isinstance(wall, str)
        else int(wall)
    )


def test_sql_and_python_stateless_steps(spark, nats_url, checkpoints, uid):
    data = _data(300)
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", data)
    flow = (
        sf.Pipeline(f"ops-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA)
        .filter("v >= 20")
        .map(w="v / 10")
        .add("w", 1.5, output="w1")
        .select("id", "device", "v", "w1")
        .map(fahrenheit, schema={"id": "long", "device": "string", "f": "double"})
        .filter(lambda r: r["f"] < 200)
        .flat_map(explode, schema={"id": "long", "device": "string", "f": "double", "part": "long"})
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}.{{device}}")
    )
    expected = [
        (r["id"], p)
        for r in data
        if r["v"] >= 20 and r["v"] * 1.8 + 32 < 200
        for p in range(r["id"] % 3)
    ]
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", len(expected))
    assert sorted((o["id"], o["part"]) for o in out) == sorted(expected)
    by_id = {r["id"]: r for r in data}
    assert all(o["f"] == pytest.approx(by_id[o["id"]]["v"] * 1.8 + 32) for o in out)
    subjects = {s for _, _, s in read_all(nats_url, f"OUT_{uid}")}
    assert subjects <= {f"out{uid}.d0", f"out{uid}.d1", f"out{uid}.d2"}  # subject templates


def test_failing_python_function_dead_letters_the_record_and_keeps_going(
    spark, nats_url, checkpoints, uid
):
    data = _data(100)
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", data)
    flow = (
        sf.Pipeline(f"fragile-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA)
        .map(fragile, id="fragile")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", 90)
    assert sorted(o["id"] for o in out) == [i for i in range(100) if i % 10]
    letters = [
        (h, d)
        for h, d, s in read_all(nats_url, "SPANFLOW_DLQ")
        if s.endswith(f"fragile-{uid}.fragile")
    ]
    assert len(letters) == 10
    assert all("ValueError: cannot handle id" in h["Spanflow-Reason"] for h, _ in letters)


def test_malformed_messages_go_to_dead_letters_and_the_query_keeps_running(
    spark, nats_url, checkpoints, uid
):
    good = [{"id": i, "device": "d", "v": 1.0, "ts": BASE + i} for i in range(20)]
    bad = [
        b"{not json",
        b'{"id": 1, "device": "d", "ts": 1}',
        b'{"id": "x", "device": "d", "v": 1, "ts": 1}',
    ]
    stream = f"IN_{uid}"
    publish(nats_url, stream, f"in{uid}.r", [*good[:10], *bad, *good[10:]])
    flow = (
        sf.Pipeline(f"dlq-{uid}", trigger=0)
        .source(stream, schema=SCHEMA, id="src")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints
    ).start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"OUT_{uid}")) >= 20)
        more = [{"id": 100 + i, "device": "d", "v": 2.0, "ts": BASE + 100 + i} for i in range(5)]
        publish(nats_url, stream, f"in{uid}.r", [*more, b"\xff\xfe binary junk"])
        wait_for(lambda: len(read_all(nats_url, f"OUT_{uid}")) >= 25)
        wait_for(lambda: runner.dead_letters() == 4)
        assert all(s.active for s in runner.status())
    finally:
        runner.stop()
    letters = {
        d: h for h, d, s in read_all(nats_url, "SPANFLOW_DLQ") if s.endswith(f"dlq-{uid}.src")
    }
    assert set(letters) == {*bad, b"\xff\xfe binary junk"}  # original bytes kept
    assert "not valid json" in letters[b"{not json"]["Spanflow-Reason"]
    assert "field 'v': required field is missing" in letters[bad[1]]["Spanflow-Reason"]
    assert "field 'id': expected integer" in letters[bad[2]]["Spanflow-Reason"]
    assert letters[bad[0]]["Spanflow-Stream"] == stream and letters[bad[0]]["Spanflow-Seq"] == "11"
    assert sorted(o["id"] for o in read_records(nats_url, f"OUT_{uid}")) == [
        *range(20),
        *range(100, 105),
    ]
    assert _stream_max_age(nats_url, "SPANFLOW_DLQ") == 7 * 86400  # dead letters are bounded


def _stream_max_age(url: str, stream: str) -> float:
    import asyncio

    from spanflow.nats.streams import connect

    async def go() -> float:
        nc = await connect(url)
        info = await nc.jetstream().stream_info(stream)
        await nc.close()
        return float(info.config.max_age or 0)

    return asyncio.run(go())


def test_running_count_per_key_emits_updates(spark, nats_url, checkpoints, uid):
    data = _data(200)
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", data)
    flow = (
        sf.Pipeline(f"count-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, key="device")
        .count()
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    oracle = Counter(r["device"] for r in data)
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", len(oracle))
    latest = {o["device"]: o["count"] for o in out}
    assert latest == dict(oracle)


def _windows_oracle(data, starts_of):
    groups = defaultdict(list)
    for r in data:
        for start in starts_of(r["ts"]):
            groups[(r["device"], start)].append(r["v"])
    return groups


def _flushed(data):
    return [*data, {"id": -1, "device": "zz", "v": 0.0, "ts": BASE + 100_000}]


def test_sliding_windows_match_oracle(spark, nats_url, checkpoints, uid):
    data = _data(160)
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", _flushed(data))
    flow = (
        sf.Pipeline(f"slide-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, event_time="ts", max_out_of_orderness="3s")
        .key_by("device")
        .window(sliding="10s", slide="5s")
        .aggregate(n="count", hi="max(v)")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    oracle = _windows_oracle(data, lambda ts: [int(ts // 5 * 5) - 5, int(ts // 5 * 5)])
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", len(oracle))
    got = {(o["device"], _start(o["window_start"])): o for o in out}
    assert set(got) == set(oracle)
    assert all(got[k]["n"] == len(v) and got[k]["hi"] == max(v) for k, v in oracle.items())


def test_session_windows_match_oracle(spark, nats_url, checkpoints, uid):
    # Three bursts per device separated by 30 s of silence; the gap is 10 s.
    data = [
        {"id": i, "device": d, "v": float(i), "ts": BASE + burst * 40 + j}
        for i, (d, burst, j) in enumerate(
            (d, b, j) for d in ("a", "b") for b in range(3) for j in range(4)
        )
    ]
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", _flushed(data))
    flow = (
        sf.Pipeline(f"session-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, event_time="ts")
        .key_by("device")
        .window(session="10s")
        .aggregate(n="count", total="sum(v)")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", 6)
    got = sorted(
        (o["device"], _start(o["window_start"]) - BASE, _start(o["window_end"]) - BASE, o["n"])
        for o in out
    )
    assert got == sorted((d, b * 40, b * 40 + 3 + 10, 4) for d in ("a", "b") for b in range(3))


def test_classic_average_per_window(spark, nats_url, checkpoints, uid):
    data = _data(120)
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", _flushed(data))
    flow = (
        sf.Pipeline(f"avg-{uid}", trigger=0)
        .source(
            f"IN_{uid}", schema=SCHEMA, event_time="ts", max_out_of_orderness="2s", key="device"
        )
        .average("v", window="20s")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    oracle = _windows_oracle(data, lambda ts: [int(ts // 20 * 20)])
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", len(oracle))
    got = {(o["device"], _start(o["window_start"])): o["average"] for o in out}
    assert got == pytest.approx({k: sum(v) / len(v) for k, v in oracle.items()})


def test_reduce_with_a_python_function(spark, nats_url, checkpoints, uid):
    data = _data(100)
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", _flushed(data))
    flow = (
        sf.Pipeline(f"reduce-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, event_time="ts", max_out_of_orderness="2s")
        .key_by("device")
        .window(tumbling="10s")
        .reduce(keep_max)
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    oracle = _windows_oracle(data, lambda ts: [int(ts // 10 * 10)])
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", len(oracle))
    got = {(o["device"], _start(o["window_start"])): o["v"] for o in out}
    assert got == {k: max(v) for k, v in oracle.items()}


def test_deduplicate_drops_repeats_within_the_interval(spark, nats_url, checkpoints, uid):
    data = [{"id": i % 50, "device": "d", "v": float(i), "ts": BASE + i * 0.1} for i in range(150)]
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", data)
    flow = (
        sf.Pipeline(f"dedup-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, event_time="ts")
        .deduplicate("id", within="1m")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", 50)
    assert sorted(o["id"] for o in out) == list(range(50))
    assert all(o["v"] == o["id"] for o in out)  # the first occurrence is kept


def test_admission_control_bounds_batches_and_commit_tracks_progress(
    spark, nats_url, checkpoints, uid
):
    import asyncio

    from spanflow.nats.streams import connect

    publish(nats_url, f"IN_{uid}", f"in{uid}.r", _data(500))
    flow = (
        sf.Pipeline(f"adm-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, max_rows_per_batch=120, id="src")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints
    ).start()

    async def ack_floor() -> int:
        nc = await connect(nats_url)
        try:
            info = await nc.jetstream().consumer_info(f"IN_{uid}", f"spanflow-adm-{uid}-src")
            return info.ack_floor.stream_seq
        except Exception:
            return 0
        finally:
            await nc.close()

    try:
        wait_for(lambda: len(read_all(nats_url, f"OUT_{uid}")) >= 500)
        # Spark commits batch N's offsets to the source when batch N+1 starts.
        publish(nats_url, f"IN_{uid}", f"in{uid}.r", _data(1))
        wait_for(lambda: asyncio.run(ack_floor()) >= 500)
        sizes = [p["numInputRows"] for p in runner.queries["sink_1"].recentProgress]  # type: ignore[union-attr]
    finally:
        runner.stop()
    assert sizes[:5] == [120, 120, 120, 120, 20]  # 500 rows, at most 120 per batch


def test_csv_stream_from_a_yaml_pipeline_with_parquet_and_console_sinks(
    spark, nats_url, tmp_path, uid
):
    rows: list[tuple[str, list[dict]]] = []
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", [f"d{i % 2};{i}".encode() for i in range(30)])
    spec = sf.load_pipeline_text(f"""
name: csv-{uid}
trigger: 0s
sources:
  - {{id: src, stream: IN_{uid}, format: csv, csv_delimiter: ";",
      schema: {{device: string, n: long}}, to: [big]}}
processors:
  - {{id: big, type: filter, where: "n >= 10", to: [files, screen]}}
sinks:
  - {{id: files, type: parquet, path: "{tmp_path / "out"}"}}
  - {{id: screen, type: console}}
""")
    runner = PipelineRunner(
        spark,
        spec,
        nats_url=nats_url,
        checkpoint_dir=tmp_path / "ck",
        on_rows=lambda sink, batch, r: rows.append((sink, r)),
    ).start()
    try:
        runner.await_idle()
    finally:
        runner.stop()
    assert sorted(r["n"] for _, batch in rows for r in batch) == list(range(10, 30))
    files = spark.read.parquet(str(tmp_path / "out"))
    assert sorted(r.n for r in files.collect()) == list(range(10, 30))


def test_sink_keeps_per_key_order_of_the_input(spark, nats_url, checkpoints, uid):
    data = [{"id": i, "device": f"d{i % 4}", "v": float(i), "ts": BASE + i} for i in range(400)]
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", data)
    flow = (
        sf.Pipeline(f"order-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, max_rows_per_batch=150)
        .filter("v >= 0")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", 400)
    for device in ("d0", "d1", "d2", "d3"):
        ids = [o["id"] for o in out if o["device"] == device]  # in stream (publish) order
        assert ids == sorted(ids) and len(ids) == 100
