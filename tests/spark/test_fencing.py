"""Fenced fragments on real Spark and NATS: a runner whose fragment was moved on (a
newer epoch claimed its fence) stops before its next publish and before Spark commits
that batch; the new owner resumes from the same checkpoint and the output is exactly
once. Every message carries the epoch that wrote it."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import spanflow as sf
from spanflow.nats.fences import EPOCH_HEADER, Fence, claim, fences
from spanflow.nats.streams import connect
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, wait_for


def _claim(url: str, fence: Fence) -> None:
    async def go() -> None:
        nc = await connect(url)
        await claim(await fences(nc.jetstream()), fence)
        await nc.close()

    asyncio.run(go())


def test_a_moved_fragment_stops_writing_and_the_new_owner_resumes_exactly_once(
    spark, nats_url, checkpoints, uid
):
    name = f"fenced-{uid}"
    flow = (
        sf.Pipeline(name, trigger="300ms")
        .source(f"FIN_{uid}", schema={"id": "long"}, id="src")
        .sink_jetstream(f"FOUT_{uid}", subject=f"fout{uid}", id="out")
    )
    old = Fence(f"{name}.f0", 1, "n1", str(checkpoints))
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, fence=old
    )
    runner.start()
    try:
        publish(nats_url, f"FIN_{uid}", f"fin{uid}.r", [{"id": i} for i in range(10)])
        wait_for(lambda: len(read_all(nats_url, f"FOUT_{uid}")) == 10)
        # The fragment moves (its node was cut off): epoch 2 claims the fence.
        _claim(nats_url, Fence(old.fragment_id, 2, "n2", old.checkpoint))
        publish(nats_url, f"FIN_{uid}", f"fin{uid}.r", [{"id": i} for i in range(10, 20)])
        wait_for(lambda: runner.fenced is not None)
        wait_for(lambda: not any(s.active for s in runner.status()))
        runner.supervise()  # a fenced query is not restarted
        assert not any(s.active for s in runner.status())
        assert "epoch 2 holds its fence; this is 1" in (runner.fenced or "")
        assert len(read_all(nats_url, f"FOUT_{uid}")) == 10  # nothing written after
    finally:
        runner.stop()

    # The new owner resumes from the same checkpoint: the batch n1 could not commit.
    new = PipelineRunner(
        spark,
        flow.spec(),
        nats_url=nats_url,
        checkpoint_dir=checkpoints,
        fence=Fence(old.fragment_id, 2, "n2", old.checkpoint),
    )
    new.start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"FOUT_{uid}")) >= 20)
    finally:
        new.stop()
    stored = read_all(nats_url, f"FOUT_{uid}")
    ids = Counter(json.loads(data)["id"] for _, data, _ in stored)
    assert ids == Counter(range(20))
    epochs = [(headers or {}).get(EPOCH_HEADER) for headers, _, _ in stored]
    assert epochs == ["1"] * 10 + ["2"] * 10


def test_a_moved_real_time_fragment_stops_and_the_new_owner_repeats_nothing(
    spark, nats_url, checkpoints, uid
):
    """A real-time batch publishes for minutes, so the runner checks its fence on the
    supervisor's beat: once a newer epoch holds it, the query stops before its batch
    commits, and the new owner's replay of that batch is de-duplicated."""
    name = f"rtfenced-{uid}"
    flow = (
        sf.Pipeline(name, mode="realtime")
        .source(f"RIN_{uid}", schema={"id": "long"}, id="src")
        .sink_jetstream(f"ROUT_{uid}", subject=f"rout{uid}", id="out")
    )
    old = Fence(f"{name}.f0", 1, "n1", str(checkpoints))
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, fence=old
    )
    runner.start()
    try:
        publish(nats_url, f"RIN_{uid}", f"rin{uid}.r", [{"id": i} for i in range(10)])
        wait_for(lambda: len(read_all(nats_url, f"ROUT_{uid}")) == 10)
        _claim(nats_url, Fence(old.fragment_id, 2, "n2", old.checkpoint))

        def stopped() -> bool:
            runner.supervise()
            return runner.fenced is not None and not any(s.active for s in runner.status())

        wait_for(stopped)
        assert "epoch 2 holds its fence; this is 1" in (runner.fenced or "")
        publish(nats_url, f"RIN_{uid}", f"rin{uid}.r", [{"id": i} for i in range(10, 20)])
        runner.supervise()  # a fenced query is not restarted
        assert not any(s.active for s in runner.status())
    finally:
        runner.stop()
    assert len(read_all(nats_url, f"ROUT_{uid}")) == 10  # nothing written once stopped

    new = PipelineRunner(
        spark,
        flow.spec(),
        nats_url=nats_url,
        checkpoint_dir=checkpoints,
        fence=Fence(old.fragment_id, 2, "n2", old.checkpoint),
    )
    new.start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"ROUT_{uid}")) >= 20)
    finally:
        new.stop()
    stored = read_all(nats_url, f"ROUT_{uid}")
    assert Counter(json.loads(data)["id"] for _, data, _ in stored) == Counter(range(20))
    epochs = [(headers or {}).get(EPOCH_HEADER) for headers, _, _ in stored]
    assert epochs == ["1"] * 10 + ["2"] * 10  # the replayed 10 were dropped as duplicates
