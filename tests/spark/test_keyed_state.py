"""Keyed processors over in-memory state (spanflow.testing): the state API, all-or-nothing
calls, timers and output checking, without a streaming query."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import spanflow as sf
from spanflow.testing import KeyedProcessorTest
from tests.spark.processors import Dedup, Heartbeat, KeepsHistory, RunningMean, Silence

T0 = datetime(2027, 1, 1, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_value_state_keeps_a_record_per_key_across_batches():
    t = KeyedProcessorTest(
        RunningMean, key="device", output_schema={"device": "string", "n": "long", "mean": "double"}
    )
    out = t.process(
        [{"device": "a", "v": 1.0}, {"device": "b", "v": 10.0}, {"device": "a", "v": 3.0}]
    )
    assert out == [{"device": "a", "n": 2, "mean": 2.0}, {"device": "b", "n": 1, "mean": 10.0}]
    assert t.process([{"device": "a", "v": 5.0}]) == [{"device": "a", "n": 3, "mean": 3.0}]
    assert t.state("stats", "a") == {"n": 3, "mean": 3.0}
    assert t.state("stats", "nobody") is None


def test_a_raising_call_leaves_state_as_it_was_and_dead_letters_the_keys_records():
    t = KeyedProcessorTest(
        RunningMean, key="device", output_schema={"device": "string", "n": "long", "mean": "double"}
    )
    t.process([{"device": "a", "v": 2.0}])
    out = t.process(
        [{"device": "a", "v": 4.0}, {"device": "a", "v": -1.0}, {"device": "b", "v": 1.0}]
    )
    assert out == [{"device": "b", "n": 1, "mean": 1.0}]  # the other key goes on
    assert t.state("stats", "a") == {"n": 1, "mean": 2.0}  # 4.0 was not half-applied
    assert [r for r, _ in t.dead_letters] == [
        {"device": "a", "v": 4.0},
        {"device": "a", "v": -1.0},
    ]
    assert all(
        reason == "ValueError in process: negative reading -1.0" for _, reason in t.dead_letters
    )


def test_event_time_timer_fires_when_the_watermark_passes_and_can_be_moved():
    t = KeyedProcessorTest(
        Silence,
        key="device",
        event_time="ts",
        output_schema={"device": "string", "silent_since": "timestamp", "fired_at": "timestamp"},
        params={"gap": 10},
    )
    t.process([{"device": "a", "ts": _at(1)}, {"device": "b", "ts": _at(2)}])
    t.process([{"device": "a", "ts": _at(5)}])  # a's deadline moves from 11 to 15
    assert t.advance_watermark(_at(11)) == []
    assert t.advance_watermark(_at(12)) == [
        {"device": "b", "silent_since": _at(2), "fired_at": _at(12)}
    ]
    assert t.advance_watermark(_at(20)) == [
        {"device": "a", "silent_since": _at(5), "fired_at": _at(15)}
    ]
    assert t.advance_watermark(_at(40)) == []  # each timer fires once


def test_processing_time_timer_fires_after_its_delay():
    t = KeyedProcessorTest(Heartbeat, key="k", output_schema={"k": "string", "tick": "timestamp"})
    t.advance_processing_time(_at(0))
    t.process([{"k": "x"}, {"k": "y"}])
    assert t.advance_processing_time(_at(0.5)) == []
    assert t.advance_processing_time(_at(1)) == [
        {"k": "x", "tick": _at(1)},
        {"k": "y", "tick": _at(1)},
    ]


def test_map_state_with_ttl_forgets_entries_after_the_ttl():
    t = KeyedProcessorTest(
        Dedup,
        key="k",
        output_schema={"k": "string", "id": "long", "v": "double"},
        timers="processing_time",
        params={"ttl": "10s"},
    )
    t.advance_processing_time(_at(0))
    first = t.process([{"k": "a", "id": 1, "v": 1.0}, {"k": "a", "id": 1, "v": 2.0}])
    assert first == [{"k": "a", "id": 1, "v": 1.0}]
    t.advance_processing_time(_at(9))
    assert t.process([{"k": "a", "id": 1, "v": 3.0}]) == []  # still remembered
    assert t.state("seen", "a") == {1: True}
    t.advance_processing_time(_at(20))
    assert t.state("seen", "a") == {}
    assert t.process([{"k": "a", "id": 1, "v": 4.0}]) == [{"k": "a", "id": 1, "v": 4.0}]


def test_list_state_and_json_state_hold_plain_data_including_bytes():
    t = KeyedProcessorTest(
        KeepsHistory, key="k", output_schema={"k": "string", "count": "long", "batches": "long"}
    )
    t.process([{"k": "a", "v": 1.0}, {"k": "a", "v": 2.0}])
    assert t.process([{"k": "a", "v": 3.0}]) == [{"k": "a", "count": 3, "batches": 2}]
    assert t.state("values", "a") == [1.0, 2.0, 3.0]
    assert t.state("profile", "a") == {"tags": [2, 1], "raw": b"\x00\xff\x00\xff"}


class _WrongOutput(sf.KeyedProcessor):
    def process(self, key, rows, ctx):
        yield {"n": "many"}


class _TypoOutput(sf.KeyedProcessor):
    def process(self, key, rows, ctx):
        yield {"count": 1}


class _BadState(sf.KeyedProcessor):
    def init(self, state):
        self.n = state.value("n", "long")

    def process(self, key, rows, ctx):
        self.n.set("three")
        return []


@pytest.mark.parametrize(
    ("processor", "reason"),
    [
        (_WrongOutput, "output field 'n': expected an integer, got 'many'"),
        (_TypoOutput, "output fields ['count'] are not in output_schema ['k', 'n']"),
        (_BadState, "state 'n': expected an integer, got 'three'"),
    ],
)
def test_output_and_state_type_errors_dead_letter_with_a_clear_reason(processor, reason):
    t = KeyedProcessorTest(processor, key="k", output_schema={"k": "string", "n": "long"})
    assert t.process([{"k": "a"}]) == []
    ((record, why),) = t.dead_letters
    assert record == {"k": "a"} and why.endswith(reason)


def test_composite_keys_reach_the_processor_as_tuples_and_fill_output_fields():
    class Pairs(sf.KeyedProcessor):
        def process(self, key, rows, ctx):
            yield {"seen": f"{key[0]}/{key[1]}:{len(rows)}"}

    t = KeyedProcessorTest(
        Pairs,
        key=("site", "line"),
        output_schema={"site": "string", "line": "long", "seen": "string"},
    )
    out = t.process([{"site": "s", "line": 1}, {"site": "s", "line": 2}, {"site": "s", "line": 1}])
    assert out == [
        {"site": "s", "line": 1, "seen": "s/1:2"},
        {"site": "s", "line": 2, "seen": "s/2:1"},
    ]


def test_records_reach_process_in_event_time_order():
    class Order(sf.KeyedProcessor):
        def process(self, key, rows, ctx):
            yield {"order": ",".join(str(r["i"]) for r in rows)}

    t = KeyedProcessorTest(
        Order, key="k", event_time="ts", output_schema={"k": "string", "order": "string"}
    )
    out = t.process([{"k": "a", "i": 2, "ts": _at(2)}, {"k": "a", "i": 1, "ts": _at(1)}])
    assert out == [{"k": "a", "order": "1,2"}]


def test_timers_without_a_clock_are_refused_with_a_hint():
    class NoClock(sf.KeyedProcessor):
        def process(self, key, rows, ctx):
            ctx.timers.register(_at(1))
            return []

    t = KeyedProcessorTest(NoClock, key="k", output_schema={"k": "string"})
    assert t.process([{"k": "a"}]) == []
    ((_, reason),) = t.dead_letters
    assert "has no timers" in reason and "timers='event_time'" in reason


def test_declaring_a_state_twice_or_with_an_unknown_type_fails_at_init():
    class Twice(sf.KeyedProcessor):
        def init(self, state):
            state.value("x")
            state.list("x")

    class Unknown(sf.KeyedProcessor):
        def init(self, state):
            state.value("x", "decimal")

    with pytest.raises(TypeError, match="state 'x' is declared twice"):
        KeyedProcessorTest(Twice, key="k", output_schema={"k": "string"})
    with pytest.raises(TypeError, match="unknown state type 'decimal'"):
        KeyedProcessorTest(Unknown, key="k", output_schema={"k": "string"})


class _SameDeadline(sf.KeyedProcessor):
    """Every key asks for a timer at the same time (as window ends do)."""

    def init(self, state):
        self.seen = state.value("seen", "long")

    def process(self, key, rows, ctx):
        self.seen.set(self.seen.get(0) + len(rows))
        ctx.timers.register(_at(60))
        return []

    def on_timer(self, key, timer, ctx):
        yield {"n": self.seen.get(), "fired_at": timer}


def test_keys_sharing_a_timer_time_each_fire_once_and_keep_their_own_state():
    t = KeyedProcessorTest(
        _SameDeadline,
        key="device",
        event_time="ts",
        output_schema={"device": "string", "n": "long", "fired_at": "timestamp"},
    )
    t.process([{"device": d, "ts": _at(i)} for i, d in enumerate("abcab")])
    t.process([{"device": "c", "ts": _at(9)}])
    assert t.advance_watermark(_at(59)) == []
    fired = t.advance_watermark(_at(61))
    assert sorted((r["device"], r["n"]) for r in fired) == [("a", 2), ("b", 2), ("c", 2)]
    assert {r["fired_at"] for r in fired} == {_at(60)}
    assert t.advance_watermark(_at(120)) == []  # each fired once, and the index is empty
    assert t.state("seen", "c") == 2


class _KeepsLast(sf.KeyedProcessor):
    """Stores the record's own timestamp and numbers as they come from pandas."""

    def init(self, state):
        self.last = state.value("last", {"ts": "timestamp", "v": "double", "n": "long"})

    def process(self, key, rows, ctx):
        before = self.last.get()
        row = rows[-1]
        self.last.set({"ts": row["ts"], "v": row["v"], "n": row["n"]})
        yield {"before": None if before is None else before["ts"]}


def test_state_keeps_pandas_timestamps_and_numpy_numbers_as_plain_values():
    import numpy as np
    import pandas as pd

    t = KeyedProcessorTest(
        _KeepsLast, key="device", output_schema={"device": "string", "before": "timestamp?"}
    )
    stamp = pd.Timestamp("2027-01-01 00:00:01.5", tz="UTC")
    t.process([{"device": "a", "ts": stamp, "v": np.float64(2.5), "n": np.int64(7)}])
    assert t.dead_letters == []
    assert t.state("last", "a") == {"ts": _at(1.5), "v": 2.5, "n": 7}
    assert t.process([{"device": "a", "ts": _at(2), "v": 1.0, "n": 1}]) == [
        {"device": "a", "before": _at(1.5)}
    ]


@pytest.mark.parametrize("partitions", [1, 2, 4, 8])
def test_buckets_spread_evenly_over_power_of_two_shuffle_partitions(spark, partitions):
    """Spark hashes the bucket id once more to pick a shuffle partition: every partition
    gets the same number of buckets, so keyed work is split evenly."""
    from spanflow.spark.compile.process import BUCKET_IDS

    ids = ",".join(str(i) for i in BUCKET_IDS)
    rows = spark.sql(  # type: ignore[attr-defined]
        f"SELECT pmod(hash(id), {partitions}) AS p, count(*) AS n "
        f"FROM (SELECT explode(array({ids})) AS id) GROUP BY p"
    ).collect()
    assert len(BUCKET_IDS) == len(set(BUCKET_IDS)) == 8
    assert sorted(r.n for r in rows) == [8 // partitions] * partitions


def test_records_are_ordered_as_the_null_safe_key_orders_them():
    """``in_order`` compares values as they are and falls back to a null-safe key when a
    null meets a value: the order (nulls last, stable) is the same either way."""
    import random

    from spanflow.spark.keyed.processor import in_order

    rng = random.Random(7)
    fields = ("ts", "_seq")
    for _ in range(200):
        records = [
            {
                "ts": rng.choice([None, 1, 2, 3]) if rng.random() < 0.3 else rng.randint(1, 3),
                "_seq": rng.choice([None, rng.randint(0, 5)]),
                "i": i,
            }
            for i in range(rng.randint(0, 8))
        ]
        safe = sorted(records, key=lambda r: tuple((r[f] is None, r[f]) for f in fields))
        assert [r["i"] for r in in_order(records, fields)] == [r["i"] for r in safe]
