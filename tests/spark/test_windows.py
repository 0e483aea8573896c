"""Windows and aggregates on real Spark and JetStream, checked against a plain-Python oracle."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime

import pytest

import spanflow as sf
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_records, wait_for

BASE = 1_800_000_000  # epoch seconds, a multiple of 10


def _readings(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = BASE + i * 0.5 + rng.uniform(-2.0, 2.0)  # out of order by up to 4 s
        out.append(
            {
                "device": f"d{rng.randrange(4)}",
                "temperature": round(rng.uniform(10, 40), 2),
                "ts": ts,
            }
        )
    return out


def _run_until(spark, nats_url, checkpoints, flow, out_stream: str, expected: int) -> list[dict]:
    """Run until the sink holds ``expected`` records (closed windows come one batch after
    the watermark passes them), then stop and return what the sink holds."""
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions=flow.functions
    ).start()
    try:
        wait_for(lambda: len(read_records(nats_url, out_stream)) >= expected)
        runner.await_idle()
    finally:
        runner.stop()
    return read_records(nats_url, out_stream)


def test_tumbling_window_aggregates_match_oracle(spark, nats_url, checkpoints, uid):
    readings = _readings(400, seed=1)
    # A flush reading far ahead moves the watermark past every window. (Spark tracks the
    # watermark over records that pass the filters before the window, so it must pass too.)
    flush = {"device": "flush", "temperature": 20.0, "ts": BASE + 10_000}
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", [*readings, flush])
    p = sf.Pipeline(f"win-{uid}")
    flow = (
        p.source(
            f"IN_{uid}",
            schema={"device": "string", "temperature": "double", "ts": "timestamp"},
            event_time="ts",
            max_out_of_orderness="5s",
        )
        .filter("temperature >= 15")
        .key_by("device")
        .window(tumbling="10s")
        .aggregate(
            n="count",
            total="sum(temperature)",
            lo="min(temperature)",
            hi="max(temperature)",
            mean="avg(temperature)",
        )
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    oracle: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in readings:
        if r["temperature"] >= 15:
            oracle[(r["device"], int(r["ts"] // 10 * 10))].append(r["temperature"])
    records = _run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", len(oracle))
    got = {
        (o["device"], int(datetime.fromisoformat(o["window_start"]).timestamp())): o
        for o in records
    }
    assert len(got) == len(records)  # each window exactly once
    assert set(got) == set(oracle)
    for k, temps in oracle.items():
        o = got[k]
        assert o["n"] == len(temps)
        assert o["total"] == pytest.approx(sum(temps))
        assert o["lo"] == min(temps) and o["hi"] == max(temps)
        assert o["mean"] == pytest.approx(sum(temps) / len(temps))
        end = datetime.fromisoformat(o["window_end"]).replace(tzinfo=UTC)
        assert end.timestamp() - k[1] == 10


def test_late_events_beyond_watermark_are_dropped_from_windows(spark, nats_url, checkpoints, uid):
    on_time = [{"device": "a", "temperature": 1.0, "ts": BASE + s} for s in (1, 2, 3, 31)]
    # After ts=31 with a 5 s delay the watermark is 26: an event for window [0,10) is too late.
    late = [{"device": "a", "temperature": 100.0, "ts": BASE + 4}]
    flush = [{"device": "a", "temperature": 0.0, "ts": BASE + 1000}]
    stream = f"IN_{uid}"
    publish(nats_url, stream, f"in{uid}.r", on_time)
    p = sf.Pipeline(f"late-{uid}", trigger=0)
    flow = (
        p.source(
            stream,
            schema={"device": "string", "temperature": "double", "ts": "timestamp"},
            event_time="ts",
            max_out_of_orderness="5s",
        )
        .key_by("device")
        .window(tumbling="10s")
        .aggregate(n="count", hi="max(temperature)")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints
    ).start()
    try:
        runner.await_idle()
        # The watermark (26) has passed window [0,10): it is emitted without the late event.
        wait_for(lambda: len(read_records(nats_url, f"OUT_{uid}")) >= 1)
        publish(nats_url, stream, f"in{uid}.r", late)
        runner.await_idle()
        publish(nats_url, stream, f"in{uid}.r", flush)
        wait_for(lambda: len(read_records(nats_url, f"OUT_{uid}")) >= 2)
    finally:
        runner.stop()
    windows = {o["window_start"][:19]: o for o in read_records(nats_url, f"OUT_{uid}")}
    assert len(windows) == 2  # [0,10) once, [30,40) once; the late event opened nothing
    first = windows[datetime.fromtimestamp(BASE, UTC).isoformat()[:19]]
    assert first["n"] == 3 and first["hi"] == 1.0  # the late 100.0 never joined its window
