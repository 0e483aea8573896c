"""Count windows and the incremental reduce of time windows: the processors alone
(checked against plain-Python oracles), then on real Spark and JetStream."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

import spanflow as sf
from spanflow.errors import SpecError
from spanflow.spark.keyed.builtins import Accumulators, CountWindows
from spanflow.testing import KeyedProcessorTest
from tests.helpers import publish, read_all, read_records, run_until, wait_for

BASE = 1_800_000_000
SCHEMA = {"id": "long", "device": "string", "v": "double", "ts": "timestamp"}
AGGS = {"n": "count", "total": "sum(v)", "mean": "avg(v)", "lo": "min(v)", "hi": "max(v)"}


def _oracle(values: list[float], size: int, slide: int) -> list[dict]:
    """Flink's countWindow(size, slide): every `slide` records, the last `size`."""
    out = []
    for n in range(slide, len(values) + 1, slide):
        w = values[max(0, n - size) : n]
        out.append(
            {"n": len(w), "total": sum(w), "mean": sum(w) / len(w), "lo": min(w), "hi": max(w)}
        )
    return out


def _values(seed: int, n: int) -> list[float]:
    rng = random.Random(seed)
    return [float(rng.randrange(-50, 50)) for _ in range(n)]


@pytest.mark.parametrize(("size", "slide"), [(4, 4), (5, 2), (6, 4), (3, 1)])
def test_count_windows_match_the_oracle_across_batches(size, slide):
    values = _values(size * 10 + slide, 37)
    t = KeyedProcessorTest(
        CountWindows,
        key="k",
        output_schema={
            "k": "string",
            "window_index": "long",
            **{name: "double?" for name in AGGS},
        },
        params={"size": size, "slide": slide, "aggregates": AGGS, "key_fields": ("k",)},
    )
    out = []
    for lo in range(0, len(values), 7):  # batches cut across windows
        out += t.process([{"k": "a", "v": v} for v in values[lo : lo + 7]])
    assert [r["window_index"] for r in out] == list(range(len(out)))
    expected = _oracle(values, size, slide)
    assert [{k: r[k] for k in AGGS} for r in out] == expected
    # Memory stays bounded by one window: at most size/gcd panes are kept.
    import math

    assert len(t.state("panes", "a")) <= size // math.gcd(size, slide)


def test_accumulators_follow_sql_null_semantics():
    acc = Accumulators(
        {"n": "count", "nv": "count(v)", "s": "sum(v)", "m": "avg(v)", "x": "max(v)"}
    )
    a, b = acc.empty(), acc.empty()
    for record in ({"v": 1}, {"v": None}, {}):
        acc.add(a, record)
    assert acc.result(a) == {"n": 3, "nv": 1, "s": 1, "m": 1.0, "x": 1}
    assert acc.result(b) == {"n": 0, "nv": 0, "s": None, "m": None, "x": None}
    assert acc.result(acc.merge([a, b, a])) == {"n": 6, "nv": 2, "s": 2, "m": 1.0, "x": 1}


def _take_max(acc, record):
    if record["v"] == 13.0:
        raise ArithmeticError("unlucky")
    return acc if acc["v"] >= record["v"] else record


def test_count_windows_on_spark_tumbling_and_sliding_are_exact(spark, nats_url, checkpoints, uid):
    devices = {"a": _values(1, 23), "b": _values(2, 17)}
    records = [
        {"id": i, "device": d, "v": v, "ts": BASE + i}
        for d, vs in devices.items()
        for i, v in enumerate(vs)
    ]
    random.Random(3).shuffle(records)  # arrival order interleaves devices, keeps per-device order
    records.sort(key=lambda r: (r["device"], r["id"]))
    stream = f"IN_{uid}"
    publish(nats_url, stream, f"in{uid}.r", records[:20])
    p = sf.Pipeline(f"cw-{uid}", trigger=0)
    keyed = p.source(stream, schema=SCHEMA, key="device", max_rows_per_batch=9)
    tumbling = (
        keyed.window(count=5)
        .aggregate(**AGGS)
        .sink_jetstream(f"TUMBLE_{uid}", subject=f"tumble{uid}")
    )
    sliding = (
        keyed.window(count=6, slide=4)
        .aggregate(**AGGS)
        .sink_jetstream(f"SLIDE_{uid}", subject=f"slide{uid}")
    )
    flow = tumbling.merge(sliding)
    from spanflow.spark.runner import PipelineRunner

    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions=flow.functions
    ).start()
    expected_tumble = {d: _oracle(vs, 5, 5) for d, vs in devices.items()}
    expected_slide = {d: _oracle(vs, 6, 4) for d, vs in devices.items()}
    try:
        publish(nats_url, stream, f"in{uid}.r", records[20:])
        wait_for(
            lambda: (
                len(read_all(nats_url, f"TUMBLE_{uid}")) >= sum(map(len, expected_tumble.values()))
                and len(read_all(nats_url, f"SLIDE_{uid}"))
                >= sum(map(len, expected_slide.values()))
            )
        )
        runner.await_idle()
    finally:
        runner.stop()
    for out, expected in ((f"TUMBLE_{uid}", expected_tumble), (f"SLIDE_{uid}", expected_slide)):
        got = defaultdict(list)
        for r in sorted(
            read_records(nats_url, out), key=lambda r: (r["device"], r["window_index"])
        ):
            got[r["device"]].append({k: r[k] for k in AGGS})
        assert set(got) == set(expected)
        for device, windows in expected.items():
            assert got[device] == windows


def test_a_failing_reduce_dead_letters_its_key_and_the_query_goes_on(
    spark, nats_url, checkpoints, uid
):
    data = [{"id": i, "device": "d", "v": float(i), "ts": BASE + i} for i in range(20)]
    data += [{"id": 99, "device": "z", "v": 0.0, "ts": BASE + 1000}]  # closes every window
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", data)
    flow = (
        sf.Pipeline(f"red-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, event_time="ts", key="device", max_rows_per_batch=10)
        .window(tumbling="10s")
        .reduce(_take_max, id="biggest")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    # Batches of 10: window [0, 10) folds v = 0..9; the batch of 10..19 meets 13 and fails
    # as a whole for its key; z's record then closes [0, 10).
    out = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", 1)
    assert [(r["id"], r["v"]) for r in out] == [(9, 9.0)]
    letters = [
        h for h, _, s in read_all(nats_url, "SPANFLOW_DLQ") if s.endswith(f"red-{uid}.biggest")
    ]
    assert sorted(int(h["Spanflow-Seq"]) for h in letters) == list(range(11, 21))
    assert {h["Spanflow-Reason"] for h in letters} == {"ArithmeticError in process: unlucky"}


def test_a_count_window_on_a_stream_without_key_is_refused_at_validation():
    with pytest.raises(SpecError, match="count window 'w' needs a keyed stream"):
        (
            sf.Pipeline("nokey")
            .source("S", schema=SCHEMA)
            .window(count=10)
            .aggregate(n="count", id="w")
            .sink_console()
            .spec()
        )
