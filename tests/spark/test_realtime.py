"""Real-Time Mode over the JVM JetStream source and sink, on real Spark and NATS.

The same pipeline, run once on micro-batches (the Python source and driver-side sink)
and once in real time (the JVM source and sink), must give the same final results, the
same dead letters, and exactly-once output across a stop in the middle of a batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.errors import CompileError, PipelineFileError
from spanflow.nats.streams import connect
from spanflow.protocol.metrics import LATENCY_BUCKETS
from spanflow.spark.connectors.jetstream import realtime
from spanflow.spark.deadletter import dlq_subject
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, run_pipeline_process, wait_for

DEVICES = ("a", "b", "c")


def _pipeline(uid: str, tag: str, mode: str, batch: str = "5m") -> str:
    return f"""
name: rt-{tag}-{uid}
mode: {mode}
sources:
  - id: readings
    stream: IN_{uid}
    schema: {{id: long, device: string, temp: double, note: "string?"}}
    to: [hot, per_device]
processors:
  - {{id: hot, type: filter, where: "temp >= 20", to: [fahrenheit]}}
  - id: fahrenheit
    type: select
    columns: [id, device, "temp * 1.8 + 32 AS temp_f", note]
    to: [alerts]
  - {{id: per_device, type: key_by, key: device, to: [totals]}}
  - id: totals
    type: aggregate
    aggregates: {{n: count, hottest: max(temp), mean: avg(temp)}}
    to: [totals_out]
sinks:
  - id: alerts
    type: jetstream
    stream: ALERTS_{tag}_{uid}
    subject: "alerts{tag}{uid}.{{device}}"
    realtime_batch: {batch}
  - id: totals_out
    type: jetstream
    stream: TOTALS_{tag}_{uid}
    subject: "totals{tag}{uid}"
    realtime_batch: {batch}
"""


def _records(lo: int, hi: int) -> list[bytes | dict[str, Any]]:
    out: list[bytes | dict[str, Any]] = []
    for i in range(lo, hi):
        out.append({"id": i, "device": DEVICES[i % 3], "temp": float(i % 40), "note": None})
        if i % 50 == 7:
            out.append(b'{"id": "x", "device": "a", "temp": 1}')  # id is not an integer
        if i % 50 == 21:
            out.append(b"not json at all")
    return out


def _payloads(url: str, stream: str) -> list[dict[str, Any]]:
    return [json.loads(data) for _, data, _ in read_all(url, stream)]


def _final_totals(url: str, stream: str) -> dict[str, dict[str, Any]]:
    """The last update per device: what a reader of the update stream ends up with."""
    return {r["device"]: r for r in _payloads(url, stream)}


def _dead_letter_seqs(url: str, pipeline: str) -> list[str]:
    subject = dlq_subject(pipeline, "readings")
    return sorted(
        (h or {}).get("Spanflow-Seq", "")
        for h, _, s in read_all(url, "SPANFLOW_DLQ")
        if s == subject
    )


def _runner(spark: Any, text: str, nats_url: str, checkpoints: Path) -> PipelineRunner:
    spec = load_pipeline_text(text, "rt.yaml")
    return PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints)


def _live(spark: Any, query_id: str) -> tuple[int, int] | None:
    live = realtime.live_read(spark, query_id)
    return None if live is None else (live.records, live.pending)


def test_realtime_gives_the_micro_batch_results(spark, nats_url, uid, tmp_path):
    n = 600
    publish(nats_url, f"IN_{uid}", f"in{uid}.x", _records(0, n))
    expected_alerts = sum(1 for i in range(n) if i % 40 >= 20)

    micro = _runner(spark, _pipeline(uid, "mb", "microbatch"), nats_url, tmp_path / "mb")
    micro.start()
    try:
        micro.await_idle()
    finally:
        micro.stop()

    real = _runner(spark, _pipeline(uid, "rt", "realtime"), nats_url, tmp_path / "rt")
    real.start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"ALERTS_rt_{uid}")) >= expected_alerts, 90)
        wait_for(lambda: len(read_all(nats_url, f"TOTALS_rt_{uid}")) >= n, 90)
        assert all(s.active and s.error is None for s in real.status())
        # Between batches (minutes apart) the readers' live counters say how far each
        # query has read: every message, malformed ones included, and none pending.
        published = len(_records(0, n))
        for q in real.queries.values():
            assert q is not None
            wait_for(lambda q=q: _live(spark, q.id) == (published, 0), 30)
        assert [s.lag for s in real.status()] == [0, 0]

        # ... and each sink's JVM writer what it published, with the end-to-end latency
        # of the records that keep their source's publish time (the alerts; the totals
        # are aggregates)
        def written(sink: str) -> int:
            real.status()  # reads the live counters into the sink's output
            out = real.outputs.get(sink)
            return -1 if out is None else out.records

        wait_for(lambda: written("alerts") == expected_alerts and written("totals_out") == n, 30)
        alerts, totals = real.outputs["alerts"].latency, real.outputs["totals_out"].latency
        assert alerts.count == expected_alerts and alerts.sum > 0 and totals.count == 0
        assert list(spark._jvm.dev.spanflow.realtime.LiveProgress.BUCKETS) == list(LATENCY_BUCKETS)
    finally:
        real.stop()

    mb_alerts = _payloads(nats_url, f"ALERTS_mb_{uid}")
    rt_alerts = _payloads(nats_url, f"ALERTS_rt_{uid}")
    assert len(rt_alerts) == expected_alerts
    assert sorted(rt_alerts, key=lambda r: r["id"]) == sorted(mb_alerts, key=lambda r: r["id"])
    assert {s for _, _, s in read_all(nats_url, f"ALERTS_rt_{uid}")} == {
        f"alertsrt{uid}.{d}" for d in DEVICES
    }

    # Real time emits an update per record; the last per device is the micro-batch total.
    mb_totals, rt_totals = (_final_totals(nats_url, f"TOTALS_{t}_{uid}") for t in ("mb", "rt"))
    assert rt_totals.keys() == set(DEVICES)
    for device in DEVICES:
        assert rt_totals[device]["n"] == mb_totals[device]["n"] == n // 3
        assert rt_totals[device]["hottest"] == mb_totals[device]["hottest"]
        assert rt_totals[device]["mean"] == pytest.approx(mb_totals[device]["mean"])
    assert len(_payloads(nats_url, f"TOTALS_rt_{uid}")) == n  # one update per record

    # Both dead-lettered the same malformed messages, once each.
    mb_dead = _dead_letter_seqs(nats_url, f"rt-mb-{uid}")
    assert mb_dead and mb_dead == _dead_letter_seqs(nats_url, f"rt-rt-{uid}")


def test_realtime_output_is_exactly_once_across_a_stop_mid_batch(spark, nats_url, uid, tmp_path):
    text = _pipeline(uid, "eo", "realtime")
    publish(nats_url, f"IN_{uid}", f"in{uid}.x", _records(1000, 1300))
    first = _runner(spark, text, nats_url, tmp_path / "ck")
    first.start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"TOTALS_eo_{uid}")) >= 300, 90)
    finally:
        first.stop()  # the 5-minute batch is cut short: nothing of it is committed
    checkpoint = tmp_path / "ck" / f"rt-eo-{uid}" / "totals_out"
    # No batch was committed, so the restart replays every record already published.
    assert not list(checkpoint.glob("commits/*"))

    second = _runner(spark, text, nats_url, tmp_path / "ck")
    second.start()
    try:
        publish(nats_url, f"IN_{uid}", f"in{uid}.x", _records(1300, 1600))
        wait_for(lambda: len(read_all(nats_url, f"TOTALS_eo_{uid}")) >= 600, 90)
        wait_for(lambda: len(read_all(nats_url, f"ALERTS_eo_{uid}")) >= 300, 60)
        assert all(s.active and s.error is None for s in second.status())
    finally:
        second.stop()
    totals = _payloads(nats_url, f"TOTALS_eo_{uid}")
    counted = Counter((r["device"], r["n"]) for r in totals)
    assert len(totals) == 600
    assert max(counted.values()) == 1  # no update twice
    assert {d: max(r["n"] for r in totals if r["device"] == d) for d in DEVICES} == {
        d: 200 for d in DEVICES
    }
    alerts = _payloads(nats_url, f"ALERTS_eo_{uid}")
    ids = Counter(r["id"] for r in alerts)
    assert set(ids) == {i for i in range(1000, 1600) if i % 40 >= 20}
    assert max(ids.values()) == 1


_run = run_pipeline_process


@pytest.mark.slow
def test_realtime_output_is_exactly_once_across_sigkill(nats_url, uid, tmp_path):
    """Killed mid-batch after an earlier batch committed (8 s batches), with input
    published while it was down: every alert and update once, and the committed batch
    moved the durable consumer that shows the pipeline's progress."""
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(uid, "kill", "realtime", batch="8s"))
    data_dir, log = tmp_path / "node", tmp_path / "run.log"
    totals = f"TOTALS_kill_{uid}"
    commits = data_dir / "checkpoints" / f"rt-kill-{uid}" / "totals_out" / "commits"
    publish(nats_url, f"IN_{uid}", f"in{uid}.x", _records(0, 900))
    proc = _run(pipeline, nats_url, data_dir, log)
    try:
        wait_for(lambda: len(read_all(nats_url, totals)) >= 900 and any(commits.glob("*")), 240)
        publish(nats_url, f"IN_{uid}", f"in{uid}.x", _records(900, 1800))
        wait_for(lambda: len(read_all(nats_url, totals)) >= 1350, 120)
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # mid-batch: its output is out, uncommitted
        proc.wait()
    floor = _ack_floor(nats_url, f"IN_{uid}", f"spanflow-rt-kill-{uid}-readings")
    assert 0 < floor < len(_records(0, 1800))
    publish(nats_url, f"IN_{uid}", f"in{uid}.x", _records(1800, 2400))
    proc = _run(pipeline, nats_url, data_dir, log)
    expected_alerts = {i for i in range(2400) if i % 40 >= 20}
    try:
        wait_for(
            lambda: (
                len(read_all(nats_url, totals)) >= 2400
                and len(read_all(nats_url, f"ALERTS_kill_{uid}")) >= len(expected_alerts)
            ),
            240,
        )
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    updates = Counter((r["device"], r["n"]) for r in _payloads(nats_url, totals))
    assert len(updates) == 2400 and max(updates.values()) == 1
    alerts = Counter(r["id"] for r in _payloads(nats_url, f"ALERTS_kill_{uid}"))
    assert set(alerts) == expected_alerts and max(alerts.values()) == 1
    assert log.read_text().count("starting Spark") == 2


def _ack_floor(url: str, stream: str, consumer: str) -> int:
    async def go() -> int:
        nc = await connect(url)
        try:
            info = await nc.jetstream().consumer_info(stream, consumer)
            return int(info.ack_floor.stream_seq if info.ack_floor else 0)
        finally:
            await nc.close()

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("step", "words"),
    [
        (
            "{id: hot, type: filter, function: 'tests.spark.processors:always', to: [out]}",
            "step 'hot' cannot: its Python function runs on micro-batches",
        ),
        (
            "{id: hot, type: window, tumbling: 10s, aggregates: {n: count}, to: [out]}",
            "emit: final needs append output",
        ),
        (
            "{id: hot, type: running, fn: count, to: [out]}",
            "a running step runs Python code",
        ),
    ],
    ids=["python-filter", "final-window", "running"],
)
def test_an_ineligible_step_is_named_with_its_line(step, words):
    text = f"""name: bad
mode: realtime
sources:
  - id: readings
    stream: IN
    schema: {{device: string, temp: double, ts: timestamp}}
    event_time: ts
    key: device
    to: [hot]
processors:
  - {step}
sinks:
  - {{id: out, type: jetstream, stream: OUT, subject: out}}
"""
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline_text(text, "bad.yaml")
    message = str(caught.value)
    assert words in message
    assert "bad.yaml:11" in message  # the offending step's line


def test_a_micro_batch_sink_may_follow_python_steps_in_a_realtime_pipeline():
    text = """name: mixed
mode: realtime
sources:
  - {id: readings, stream: IN, schema: {device: string, temp: double}, to: [py, fast]}
processors:
  - {id: py, type: filter, function: 'tests.spark.processors:always', to: [slow]}
  - {id: fast, type: filter, where: "temp > 1", to: [quick]}
sinks:
  - {id: slow, type: jetstream, stream: OUT, subject: slow, mode: microbatch}
  - {id: quick, type: jetstream, stream: OUT, subject: quick}
"""
    spec = load_pipeline_text(text, "mixed.yaml")
    modes = {s.id: spec.mode_of(s) for s in spec.sinks()}
    assert modes == {"slow": "microbatch", "quick": "realtime"}
    assert spec.realtime_slots() == 1


def test_real_time_sinks_start_first_and_a_bad_micro_batch_sink_stops_them(
    spark, nats_url, uid, tmp_path, caplog
):
    name = f"first-{uid}"
    text = f"""name: {name}
mode: realtime
sources:
  - {{id: readings, stream: IN_{uid}, schema: {{device: string, temp: double}}, to: [py, fast]}}
processors:
  - {{id: py, type: filter, function: 'tests.spark.processors:no_such_function', to: [slow]}}
  - {{id: fast, type: filter, where: "temp > 1", to: [quick]}}
sinks:
  - {{id: slow, type: jetstream, stream: OUT_{uid}, subject: "slow{uid}", mode: microbatch}}
  - {{id: quick, type: jetstream, stream: OUT_{uid}, subject: "quick{uid}"}}
"""
    runner = _runner(spark, text, nats_url, tmp_path / "checkpoints")
    with (
        caplog.at_level("INFO", logger="spanflow.spark.runner"),
        pytest.raises(CompileError, match="no_such_function"),
    ):
        runner.start()
    started = [r.getMessage() for r in caplog.records if "started" in r.getMessage()]
    assert started and started[0].startswith(f"started {name}.quick in real time")
    assert not [q for q in spark.streams.active if q.name and name in q.name]


def test_live_rates_say_when_a_real_time_query_falls_behind():
    start = realtime.LiveRead(records=1000, pending=0, last_published_ms=0, at=10.0)
    keeping_up = realtime.LiveRead(records=3000, pending=0, last_published_ms=0, at=12.0)
    assert realtime.rates(start, keeping_up) == (1000.0, 1000.0)
    behind = realtime.LiveRead(records=3000, pending=4000, last_published_ms=0, at=12.0)
    assert realtime.rates(start, behind) == (3000.0, 1000.0)  # the backlog grows 2,000/s
    catching_up = realtime.LiveRead(records=9000, pending=1000, last_published_ms=0, at=14.0)
    assert realtime.rates(behind, catching_up) == (1500.0, 3000.0)  # it shrinks 1,500/s
    restarted = realtime.LiveRead(records=10, pending=0, last_published_ms=0, at=15.0)
    assert realtime.rates(catching_up, restarted) == (0.0, 0.0)
    assert realtime.rates(None, start) == (0.0, 0.0)
