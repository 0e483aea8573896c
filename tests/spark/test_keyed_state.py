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
