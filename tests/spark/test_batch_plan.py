"""Replicas of a query that agree their batches (hot standby's ground): a second replica
started later, with its own checkpoint, runs the very batches the first ran — so its
windows, the late reading it drops and its message ids are the first's, and the output
stream keeps one copy. Without the agreement the same replica writes other rows."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import spanflow as sf
from spanflow.nats.batch_plan import PLAN_BUCKET
from spanflow.nats.streams import SyncNats
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_records, wait_for

BASE = 1_800_000_000


def _flow(uid: str) -> Any:
    p = sf.Pipeline(f"twin-{uid}")
    return (
        p.source(
            f"TW_IN_{uid}",
            schema={"device": "string", "ts": "timestamp", "v": "double"},
            event_time="ts",
            max_out_of_orderness="1s",
        )
        .key_by("device")
        .window(tumbling="5s")
        .aggregate(n="count", total="sum(v)")
        .sink_jetstream(f"TW_OUT_{uid}", subject=f"twout{uid}")
    )


def _replica(spark: Any, url: str, flow: Any, checkpoints: Path, plan: str | None) -> Any:
    return PipelineRunner(
        spark, flow.spec(), nats_url=url, checkpoint_dir=checkpoints, batch_plan=plan
    ).start()


def _windows(url: str, uid: str) -> Counter[tuple[str, str, int, float]]:
    return Counter(
        (r["device"], r["window_start"], r["n"], r["total"])
        for r in read_records(url, f"TW_OUT_{uid}")
    )


@pytest.mark.parametrize("agreed", [True, False], ids=["agreed", "alone"])
def test_a_later_replica_runs_the_same_batches_and_adds_nothing(
    spark: Any, nats_url: str, uid: str, tmp_path: Path, agreed: bool
) -> None:
    flow, subject = _flow(uid), f"twin{uid}.r"
    plan = f"twin-{uid}.fragment" if agreed else None
    chunk = [
        {"device": f"d{i % 4}", "ts": BASE + i * 0.5, "v": float(i)} for i in range(40)
    ]  # 20 s of event time
    late = {"device": "d0", "ts": BASE + 1, "v": 1000.0}  # its window closed long ago
    fresh = [{"device": f"d{i % 4}", "ts": BASE + 20 + i * 0.5, "v": 1.0} for i in range(10)]
    flush = [{"device": "flush", "ts": BASE + 1000, "v": 0.0}]
    expected = {(r["device"], int((r["ts"] - BASE) // 5)) for r in chunk + fresh}

    first = _replica(spark, nats_url, flow, tmp_path / "a", plan)
    try:
        # One batch (or more) each. Spark judges a reading late by the watermark the
        # batch before last left, so the late one comes two batches after the chunk.
        # Nothing comes after the flush: the windows it closes are emitted by a batch
        # without data (Spark's own alone; an agreed idle tick under the plan).
        for part in (chunk, fresh[:5], [late, *fresh[5:]], flush):
            publish(nats_url, f"TW_IN_{uid}", subject, part)
            first.await_idle()
        wait_for(lambda: sum(_windows(nats_url, uid).values()) >= len(expected), timeout=120)
        first.await_idle()
    finally:
        first.stop()
    written = _windows(nats_url, uid)
    # Every window once, the late reading dropped (its window holds only its on-time rows).
    assert sum(written.values()) == len(expected) == len({w[:2] for w in written})
    d0_first = next(w for w in written if w[0] == "d0" and _start(w[1]) == BASE)
    assert d0_first[3] < 1000.0, d0_first

    second = _replica(spark, nats_url, flow, tmp_path / "b", plan)
    try:
        second.await_idle()  # through the first's batches, the emitting one last
        if not agreed:  # its own batches: all in one, then one without data that emits
            wait_for(lambda: _windows(nats_url, uid) != written, timeout=60)
    finally:
        second.stop()
    after = _windows(nats_url, uid)
    if agreed:
        assert after == written  # the same batches: the same rows and message ids
        assert _agreed_batches(nats_url) >= 5  # one per part the first was given, a tick
    else:
        assert after != written  # other batches: other ids, and the late reading counted


def _start(window_start: str) -> float:
    return datetime.fromisoformat(window_start.replace("Z", "+00:00")).timestamp()


def _agreed_batches(url: str) -> int:
    client = SyncNats(url)
    try:

        async def count() -> int:
            kv = await client.js.key_value(PLAN_BUCKET)
            return len(await kv.keys())

        return client.run(count)
    finally:
        client.close()
