"""Which windows decide a source's late records, and when a record is late (pure)."""

from __future__ import annotations

import pyarrow as pa

import spanflow as sf
from spanflow.spark.late_records import late_rows, late_watermark_us
from spanflow.spec.lateness import LateRule, is_late, late_rules

SCHEMA = {"id": "long", "v": "double", "ts": "timestamp"}
S = 1_000_000  # µs per second


def _source(flow: sf.Pipeline) -> sf.Stream:
    return flow.source("IN", schema=SCHEMA, event_time="ts")


def test_a_source_feeding_only_windows_through_row_steps_gets_their_rules():
    flow = sf.Pipeline("p")
    windows = (
        _source(flow)
        .filter("v > 0")
        .map(w="v * 2")
        .key_by("id")
        .window(sliding="30s", slide="10s")
        .aggregate(n="count", id="w")
    )
    spec = windows.sink_jetstream("OUT", subject="out").spec()
    (rule,) = late_rules(spec)[spec.sources()[0].id]
    assert (rule.window, rule.kind, rule.size, rule.slide) == ("w", "sliding", 30.0, 10.0)


def test_no_rules_when_a_record_could_also_reach_something_else():
    raw = _source(sf.Pipeline("p"))
    windows = raw.window(tumbling="10s").aggregate(n="count").sink_jetstream("A", subject="a")
    # the raw records too: a late one must reach B
    spec = windows.merge(raw.sink_jetstream("B", subject="b")).spec()
    assert late_rules(spec) == {}
    # ...but the query of the window's sink alone reads the source for the window only
    window_path = {s.id for s in spec.expanded().path_to(spec.sinks()[0].id)}
    ((rule,),) = late_rules(spec, window_path).values()
    assert rule.kind == "tumbling"


def same(record):
    return record


def test_no_rules_when_event_time_is_rewritten_or_python_runs_first():
    for stream in (
        _source(sf.Pipeline("p")).map(ts="ts + INTERVAL 1 HOUR"),
        _source(sf.Pipeline("q")).map(same, schema=SCHEMA),
    ):
        spec = (
            stream.window(tumbling="10s").aggregate(n="count").sink_jetstream("O", subject="o")
        ).spec()
        assert late_rules(spec) == {}


def test_the_last_window_holding_a_record_decides():
    tumbling = LateRule("w", "tumbling", size=10, slide=10)
    sliding = LateRule("w", "sliding", size=30, slide=10)
    session = LateRule("w", "session", gap=5)
    assert tumbling.last_end_us(17 * S) == 20 * S
    assert tumbling.last_end_us(20 * S) == 30 * S  # a window's end is not in it
    assert sliding.last_end_us(17 * S) == 40 * S  # [10, 40) is the last of three
    assert session.last_end_us(17 * S) == 22 * S
    assert tumbling.last_end_us(-3 * S) == 0  # before 1970 too
    assert is_late((tumbling,), 17 * S, 20 * S)
    assert not is_late((tumbling,), 17 * S, 20 * S - 1)
    assert not is_late((tumbling, sliding), 17 * S, 30 * S)  # the sliding one is open
    assert not is_late((), 17 * S, 10**9 * S)


def test_late_rows_of_an_arrow_batch_leave_heartbeats_and_null_times_alone():
    times = [5 * S, 15 * S, None, 8 * S]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(times, pa.timestamp("us", tz="UTC")), pa.array([False, False, False, True])],
        names=["ts", "_heartbeat"],
    )
    rule = LateRule("w", "tumbling", size=10, slide=10)
    assert late_rows(batch, "ts", (rule,), 10 * S).tolist() == [0]
    assert late_rows(batch, "ts", (rule,), 20 * S).tolist() == [0, 1]


def test_the_watermark_for_late_records_is_the_batch_befores(tmp_path):
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    assert late_watermark_us(str(tmp_path)) is None
    for batch, millis in ((0, 0), (1, 7000), (2, 21000)):
        meta = f'{{"batchWatermarkMs":{millis},"batchTimestampMs":1,"conf":{{}}}}'
        (offsets / str(batch)).write_text(f'v1\n{meta}\n{{"seq": 4}}\n')
    (offsets / ".2.crc").write_text("x")
    # planning batch 2: Spark drops by batch 1's watermark
    assert late_watermark_us(str(tmp_path)) == 7000 * 1000
    assert late_watermark_us("jetstream://store/cp") is None  # not read from here
