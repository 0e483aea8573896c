"""Staggered batch starts: slots, the source's wait, and per-sink triggers on real Spark."""

from __future__ import annotations

import pytest

import spanflow as sf
import spanflow.spark.connectors.jetstream.source as jetstream
from spanflow.spark.connectors import SourceContext
from spanflow.spark.connectors.jetstream.source import JetStreamReader, source_options
from spanflow.spark.query.stagger import (
    MAX_SPREAD,
    BatchSlots,
    SlotPacer,
    phase_ms,
    van_der_corput,
    wait_for_slot,
)
from spanflow.spark.runner import PipelineRunner
from spanflow.spec.steps.io import SourceStep
from tests.helpers import publish, read_all, supervising, wait_for


def test_slots_spread_evenly_whatever_their_number():
    assert [van_der_corput(k) for k in range(6)] == [0, 0.5, 0.25, 0.75, 0.125, 0.625]
    slots = BatchSlots()
    taken = sorted(slots.take() for _ in range(8))
    assert taken == [i / 8 for i in range(8)]
    shifted = BatchSlots(offset=0.3)
    assert [round(shifted.take(), 3) for _ in range(3)] == [0.3, 0.8, 0.55]
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        BatchSlots(offset=1.0)


def test_phase_spreads_over_at_most_two_seconds_and_never_for_trigger_zero():
    assert phase_ms(0.5, 1.0) == 500
    assert phase_ms(0.5, 10.0) == 1000  # spread over 2 s, not the whole 10 s
    assert phase_ms(0.5, 0.0) == 0


def test_wait_for_slot_sleeps_to_the_slot_only_when_before_it():
    slept: list[float] = []
    # 2.1 s into a 2 s interval = 100 ms past the boundary; the slot is at 500 ms.
    waited = wait_for_slot(500, 2000, now=lambda: 1_000_002.1, sleep=slept.append)
    assert waited == pytest.approx(0.4) and slept == [pytest.approx(0.4)]
    assert wait_for_slot(500, 2000, now=lambda: 1_000_002.6, sleep=slept.append) == 0.0
    assert wait_for_slot(0, 2000, now=lambda: 1_000_002.1, sleep=slept.append) == 0.0
    assert len(slept) == 1


def test_a_source_waits_for_its_slot_unless_it_is_catching_up(nats_url, uid, monkeypatch):
    publish(nats_url, f"SLOT_{uid}", f"slot{uid}.r", [{"i": i} for i in range(25)])
    waits: list[tuple[int, int]] = []
    monkeypatch.setattr(jetstream, "wait_for_slot", lambda p, i: waits.append((p, i)) or 0.0)
    step = SourceStep(id="s", stream=f"SLOT_{uid}", schema={"i": "long"}, max_rows_per_batch=10)
    context = SourceContext(
        spark=None,  # type: ignore[arg-type]  # the reader alone: no query
        nats_url=nats_url,
        pipeline="p",
        query_token="",
        ddl="i BIGINT",
        schema={"i": "long"},
    )
    slot = {"phase_ms": "300", "interval_ms": "1000", "heartbeat": ""}
    reader = JetStreamReader({**source_options(context, step), **slot})
    try:
        limit = reader.getDefaultReadLimit()
        start = reader.initialOffset()
        ends = []
        for _ in range(4):
            end = reader.latestOffset(start, limit)
            ends.append(end["seq"])
            start = end
    finally:
        reader.stop()
    assert ends == [11, 21, 26, 26]
    # Not before the first batch after a (re)start (a moved fragment's output is late
    # already), not while a backlog remains (10 of 25, 20 of 25); once caught up.
    assert waits == [(300, 1000)]


def test_queries_of_a_runner_take_different_slots_and_a_sink_its_own_trigger(
    spark, nats_url, checkpoints, uid
):
    schema = {"id": "long", "v": "double"}
    src = sf.Pipeline(f"paced-{uid}", trigger="500ms").source(
        f"PACED_{uid}", schema=schema, id="src"
    )
    flow = src.sink_jetstream(f"FAST_{uid}", subject=f"fast{uid}", id="fast").merge(
        src.sink_jetstream(f"SLOW_{uid}", subject=f"slow{uid}", trigger="1500ms", id="slow")
    )
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        with supervising(runner):  # a query that fails once comes back, as on a node
            for round_ in range(3):
                publish(nats_url, f"PACED_{uid}", f"paced{uid}.r", [{"id": round_, "v": 1.0}])
                wait_for(lambda n=round_ + 1: len(read_all(nats_url, f"SLOW_{uid}")) >= n)
            wait_for(lambda: len(read_all(nats_url, f"FAST_{uid}")) >= 3, timeout=60)
        assert len(read_all(nats_url, f"FAST_{uid}")) == 3
        queries = runner.queries
        triggers = {
            name: str(q._jsq.streamingQuery().trigger())  # type: ignore[union-attr]
            for name, q in queries.items()
        }
    finally:
        runner.stop()
    slow_progress = queries["slow"].recentProgress  # type: ignore[union-attr]
    status = {s.sink: s for s in runner.status()}
    assert triggers == {
        "fast": "ProcessingTimeTrigger(500)",
        "slow": "ProcessingTimeTrigger(1500)",
    }
    slots = {name: sup.slot for name, sup in runner._queries.items()}
    assert slots == {"fast": 0.0, "slow": 0.5}
    # The slow query starts its batches 750 ms into each interval: its source waits.
    waited = [p["durationMs"].get("latestOffset", 0) for p in slow_progress]
    assert max(waited) >= 600, waited
    last = slow_progress[-1]["durationMs"]
    assert status["slow"].last_batch_ms == max(
        0, last["triggerExecution"] - last.get("latestOffset", 0)
    )


class _FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.t += s


def test_slot_pacer_lets_one_batch_through_per_interval_at_its_slot() -> None:
    clock = _FakeClock(100.25)
    pacer = SlotPacer(500, 1000, now=clock.now, sleep=clock.sleep)
    assert pacer.due() and clock.slept == []  # the 99.5 s slot passed: at once
    assert pacer.due() and clock.slept == [0.25]  # waits for the 100.5 s slot
    clock.t = 103.9  # a batch ran long: slots were missed, the next goes at once
    assert pacer.due() and clock.slept == [0.25]


def test_slot_pacer_waits_at_most_max_spread_then_lets_spark_ask_again() -> None:
    clock = _FakeClock(10.0)
    pacer = SlotPacer(0, 5000, now=clock.now, sleep=clock.sleep)
    assert pacer.due()
    assert not pacer.due() and clock.slept == [MAX_SPREAD]
    assert not pacer.due()
    assert pacer.due() and clock.t == pytest.approx(15.0)


def test_slot_pacer_with_zero_interval_never_waits() -> None:
    clock = _FakeClock(1.0)
    pacer = SlotPacer(0, 0, now=clock.now, sleep=clock.sleep)
    assert all(pacer.due() for _ in range(5)) and clock.slept == []
