"""Keyed processors on real Spark (transformWithState) and JetStream."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime

import pytest

import spanflow as sf
from spanflow.errors import CompileError, SpecError
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, read_records, wait_for
from tests.spark.processors import Dedup, Heartbeat, RunningMean, Silence

BASE = 1_800_000_000
SCHEMA = {"id": "long", "device": "string", "v": "double", "ts": "timestamp"}
MEAN_OUT = {"device": "string", "n": "long", "mean": "double"}


def _runner(spark, nats_url, checkpoints, flow) -> PipelineRunner:
    return PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions=flow.functions
    ).start()


def _dead_letters(nats_url, pipeline, step):
    return [
        (h, d) for h, d, s in read_all(nats_url, "SPANFLOW_DLQ") if s.endswith(f"{pipeline}.{step}")
    ]


def test_keyed_state_is_exact_and_a_failing_key_is_dead_lettered_with_its_state_kept(
    spark, nats_url, checkpoints, uid
):
    stream, out = f"IN_{uid}", f"OUT_{uid}"
    flow = (
        sf.Pipeline(f"mean-{uid}", trigger=0)
        .source(stream, schema=SCHEMA, key="device")
        .process(RunningMean, output_schema=MEAN_OUT, id="mean")
        .sink_jetstream(out, subject=f"out{uid}")
    )
    phase1 = [{"id": i, "device": f"d{i % 3}", "v": float(i), "ts": BASE + i} for i in range(30)]
    bad = [
        {"id": 100, "device": "d1", "v": 7.0, "ts": BASE},
        {"id": 101, "device": "d1", "v": -5.0, "ts": BASE},
    ]
    phase3 = [{"id": 200 + i, "device": f"d{i % 3}", "v": 1.0, "ts": BASE} for i in range(6)]
    publish(nats_url, stream, f"in{uid}.r", phase1)
    runner = _runner(spark, nats_url, checkpoints, flow)
    try:
        wait_for(lambda: len(read_all(nats_url, out)) >= 3)
        publish(nats_url, stream, f"in{uid}.r", bad)
        # the batch with the failing reading (seq 32) is dead-lettered: the good one
        # before it (seq 31) too when both came in one micro-batch, which a busy
        # machine does not promise
        wait_for(lambda: 32 in _dead_seqs(nats_url, f"mean-{uid}"))
        publish(nats_url, stream, f"in{uid}.r", phase3)
        wait_for(lambda: len(read_all(nats_url, out)) >= 6)
        runner.await_idle()
        assert all(s.active for s in runner.status())
    finally:
        runner.stop()
    dead = _dead_seqs(nats_url, f"mean-{uid}")
    assert dead in ([31, 32], [32])
    kept = [] if 31 in dead else bad[:1]  # a 7.0 processed in a batch of its own counts
    rows = read_records(nats_url, out)
    latest = {r["device"]: r for r in rows}
    for device in ("d0", "d1", "d2"):
        values = [r["v"] for r in phase1 + kept + phase3 if r["device"] == device]
        assert latest[device]["n"] == len(values)  # d1's failed batch left no trace
        assert latest[device]["mean"] == pytest.approx(sum(values) / len(values))
    letters = _dead_letters(nats_url, f"mean-{uid}", "mean")
    assert {h["Spanflow-Reason"] for h, _ in letters} == {
        "ValueError in process: negative reading -5.0"
    }


def _dead_seqs(nats_url: str, pipeline: str) -> list[int]:
    return sorted(int(h["Spanflow-Seq"]) for h, _ in _dead_letters(nats_url, pipeline, "mean"))


def test_event_time_timers_fire_as_the_watermark_passes(spark, nats_url, checkpoints, uid):
    stream, out = f"IN_{uid}", f"OUT_{uid}"
    flow = (
        sf.Pipeline(f"silence-{uid}", trigger=0)
        .source(stream, schema=SCHEMA, key="device", event_time="ts", max_out_of_orderness="1s")
        .process(
            Silence,
            output_schema={
                "device": "string",
                "silent_since": "timestamp",
                "fired_at": "timestamp",
            },
            params={"gap": 10},
        )
        .sink_jetstream(out, subject=f"out{uid}")
    )
    # a speaks at 0..4 then stops; b speaks until 30; a flush record moves time to 100.
    data = [{"id": i, "device": "a", "v": 0.0, "ts": BASE + i} for i in range(5)]
    data += [{"id": 10 + i, "device": "b", "v": 0.0, "ts": BASE + 2 * i} for i in range(16)]
    data += [{"id": 99, "device": "z", "v": 0.0, "ts": BASE + 100}]
    publish(nats_url, stream, f"in{uid}.r", data)
    runner = _runner(spark, nats_url, checkpoints, flow)
    try:
        wait_for(lambda: len(read_all(nats_url, out)) >= 2)
        runner.await_idle()
        # A row behind the watermark (99 s) is dead-lettered with its reason, not
        # dropped in silence by Spark, and never reaches the processor.
        late = {"id": 100, "device": "a", "v": 0.0, "ts": BASE + 50}
        publish(nats_url, stream, f"in{uid}.r", [late])
        wait_for(lambda: len(_dead_letters(nats_url, f"silence-{uid}", "process_1")) >= 1)
        runner.await_idle()
    finally:
        runner.stop()
    got = {
        r["device"]: (_secs(r["silent_since"]) - BASE, _secs(r["fired_at"]) - BASE)
        for r in read_records(nats_url, out)
    }
    assert got == {"a": (4, 14), "b": (30, 40)}  # z's deadline (110) is not yet passed
    letters = _dead_letters(nats_url, f"silence-{uid}", "process_1")
    assert len(letters) == 1
    headers, data = letters[0]
    assert "late: ts" in headers["Spanflow-Reason"]
    assert "is not after the watermark" in headers["Spanflow-Reason"]
    assert json.loads(data)["id"] == 100


def test_processing_time_timer_fires_without_new_input(spark, nats_url, checkpoints, uid):
    stream, out = f"IN_{uid}", f"OUT_{uid}"
    flow = (
        sf.Pipeline(f"beat-{uid}", trigger="200ms")
        .source(stream, schema=SCHEMA, key="device")
        .process(Heartbeat, output_schema={"device": "string", "tick": "timestamp"})
        .sink_jetstream(out, subject=f"out{uid}")
    )
    publish(nats_url, stream, f"in{uid}.r", [{"id": 1, "device": "a", "v": 0.0, "ts": BASE}])
    started = time.time()
    runner = _runner(spark, nats_url, checkpoints, flow)
    try:
        wait_for(lambda: len(read_all(nats_url, out)) >= 1)
    finally:
        runner.stop()
    (row,) = read_records(nats_url, out)
    assert row["device"] == "a" and _secs(row["tick"]) >= started + 1.0


def test_ttl_expires_processing_time_state(spark, nats_url, checkpoints, uid):
    stream, out = f"IN_{uid}", f"OUT_{uid}"
    flow = (
        sf.Pipeline(f"ttl-{uid}", trigger="200ms")
        .source(stream, schema=SCHEMA, key="device")
        .process(
            Dedup,
            output_schema={"device": "string", "id": "long", "v": "double"},
            timers="processing_time",
            params={"ttl": "8s"},  # a repeat on a busy machine still comes within it
        )
        .sink_jetstream(out, subject=f"out{uid}")
    )
    runner = _runner(spark, nats_url, checkpoints, flow)
    subject = f"in{uid}.r"
    try:
        # TTL counts from the writing batch's start; the first batch takes seconds.
        publish(nats_url, stream, subject, [{"id": 0, "device": "warm-up", "v": 0.0, "ts": BASE}])
        wait_for(lambda: len(read_all(nats_url, out)) >= 1)
        written = time.time()  # the batch that stores id 1 starts after this (± a poll)
        publish(nats_url, stream, subject, [{"id": 1, "device": "a", "v": 1.0, "ts": BASE}])
        wait_for(lambda: len(read_all(nats_url, out)) >= 2)
        # A repeat within the TTL is dropped (id 2 marks that the batch was processed).
        publish(nats_url, stream, subject, [{"id": 1, "device": "a", "v": 2.0, "ts": BASE}])
        publish(nats_url, stream, subject, [{"id": 2, "device": "a", "v": 0.0, "ts": BASE}])
        wait_for(lambda: len(read_all(nats_url, out)) >= 3)
        assert [r["id"] for r in read_records(nats_url, out)] == [0, 1, 2]

        def repeat_passes() -> bool:
            publish(nats_url, stream, subject, [{"id": 1, "device": "a", "v": 3.0, "ts": BASE}])
            return any(r["v"] == 3.0 for r in read_records(nats_url, out))

        wait_for(repeat_passes, timeout=60, interval=0.5)
    finally:
        runner.stop()
    assert time.time() - written >= 8.0 - 0.3  # Spark's batch clock vs ours


def test_a_processor_on_a_stream_without_key_is_refused_at_validation():
    with pytest.raises(SpecError, match="process 'mean' needs a keyed stream"):
        (
            sf.Pipeline("nokey")
            .source("S", schema=SCHEMA)
            .process(RunningMean, output_schema=MEAN_OUT, id="mean")
            .sink_console()
            .spec()
        )


def test_event_time_timers_without_event_time_are_refused_at_validation():
    with pytest.raises(SpecError, match="uses event-time timers but its input has no event time"):
        (
            sf.Pipeline("notime")
            .source("S", schema=SCHEMA, key="device")
            .process(Silence, output_schema={"device": "string"}, timers="event_time")
            .sink_console()
            .spec()
        )


def test_a_processor_reference_that_is_not_a_processor_fails_to_compile(spark, nats_url):
    from spanflow.spark.compile.pipeline import compile_pipeline

    spec = sf.PipelineSpec.model_validate(
        {
            "name": "wrong",
            "steps": [
                {"id": "in", "type": "source", "stream": "S", "schema": SCHEMA, "key": "device"},
                {
                    "id": "p",
                    "type": "process",
                    "inputs": ["in"],
                    "processor": "collections:Counter",
                    "output_schema": {"device": "string"},
                },
                {"id": "out", "type": "sink", "kind": "console", "inputs": ["p"]},
            ],
        }
    )
    with pytest.raises(CompileError, match="'collections:Counter' is not a class derived from"):
        compile_pipeline(spark, spec, nats_url=nats_url)
    assert Counter  # the class the reference names exists; it is simply not a processor


def _secs(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()
