"""Fenced fragments on real Spark and NATS: a runner whose fragment was moved on (a
newer epoch claimed its fence) stops before its next publish and before Spark commits
that batch; the new owner resumes from the same checkpoint and the output is exactly
once. Every message carries the epoch that wrote it."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

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


def _publish_raw(url: str, subject: str, data: bytes) -> None:
    async def go() -> None:
        nc = await connect(url)
        await nc.jetstream().publish(subject, data)
        await nc.close()

    asyncio.run(go())


def _letters(url: str, pipeline: str) -> list[dict[str, str]]:
    return [
        headers or {}
        for headers, _, subject in read_all(url, "SPANFLOW_DLQ")
        if f".{pipeline}." in subject
    ]


@pytest.mark.parametrize("mode", ["microbatch", "realtime"])
def test_a_moved_fragment_stops_writing_and_the_new_owner_resumes_exactly_once(
    spark, nats_url, checkpoints, uid, mode
):
    """A micro-batch checks the fence before each publish; a real-time batch publishes
    for minutes, so its runner checks the fence on the supervisor's beat and stops the
    query before its batch commits. Either way the new owner's replay of the uncommitted
    batch is de-duplicated."""
    name = f"fenced-{mode}-{uid}"
    flow = (
        sf.Pipeline(name, trigger="300ms", mode=mode)
        .source(f"FIN_{mode}_{uid}", schema={"id": "long"}, id="src")
        .sink_jetstream(f"FOUT_{mode}_{uid}", subject=f"fout{mode}{uid}", id="out")
    )
    source, out = f"FIN_{mode}_{uid}", f"FOUT_{mode}_{uid}"
    old = Fence(f"{name}.f0", 1, "n1", str(checkpoints))

    def resume_as(fence: Fence) -> PipelineRunner:
        runner = PipelineRunner(
            spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, fence=fence
        )
        return runner.start()

    def more() -> None:
        publish(nats_url, source, f"fin{mode}{uid}.r", [{"id": i} for i in range(10, 20)])

    # Stored first: a real-time source whose stream does not exist yet fails its query,
    # which only the supervisor restarts.
    publish(nats_url, source, f"fin{mode}{uid}.r", [{"id": i} for i in range(10)])
    runner = resume_as(old)
    try:
        wait_for(lambda: len(read_all(nats_url, out)) == 10)
        # The fragment moves (its node was cut off): epoch 2 claims the fence.
        _claim(nats_url, Fence(old.fragment_id, 2, "n2", old.checkpoint))
        if mode == "microbatch":
            more()  # the next batch checks the fence before it publishes

        def stopped() -> bool:
            runner.supervise()
            return runner.fenced is not None and not any(s.active for s in runner.status())

        wait_for(stopped)
        if mode == "realtime":
            more()  # the stopped query reads none of it
        runner.supervise()  # a fenced query is not restarted
        assert not any(s.active for s in runner.status())
        assert "epoch 2 holds its fence; this is 1" in (runner.fenced or "")
        assert len(read_all(nats_url, out)) == 10  # nothing written after
    finally:
        runner.stop()

    # The new owner resumes from the same checkpoint: the batch n1 could not commit.
    new = resume_as(Fence(old.fragment_id, 2, "n2", old.checkpoint))
    try:
        wait_for(lambda: len(read_all(nats_url, out)) >= 20)
        if mode == "microbatch":  # its dead letters carry its epoch too
            _publish_raw(nats_url, f"fin{mode}{uid}.r", b"not json")
            wait_for(lambda: _letters(nats_url, name) != [])
            assert [h.get(EPOCH_HEADER) for h in _letters(nats_url, name)] == ["2"]
    finally:
        new.stop()
    stored = read_all(nats_url, out)
    ids = Counter(json.loads(data)["id"] for _, data, _ in stored)
    assert ids == Counter(range(20))
    epochs = [(headers or {}).get(EPOCH_HEADER) for headers, _, _ in stored]
    assert epochs == ["1"] * 10 + ["2"] * 10  # a replayed batch was dropped as duplicates


def test_a_fragment_whose_checkpoint_vanished_refuses_to_start_from_scratch(
    spark, nats_url, checkpoints, uid
):
    """Its sink's ledger says it published from that checkpoint: a start without it
    would read the source again from the beginning. The error names the fragment and
    the checkpoint; once it is back, the fragment resumes."""
    from spanflow.errors import CheckpointLost
    from spanflow.nats.ledger import Mark, lost_checkpoint

    assert lost_checkpoint(Mark(batch=3, end_seq=9), has_offsets=False)
    assert not lost_checkpoint(Mark(batch=-1, end_seq=0), has_offsets=False)  # never published
    assert not lost_checkpoint(None, has_offsets=False)
    assert not lost_checkpoint(Mark(batch=3, end_seq=9), has_offsets=True)

    name = f"lost-{uid}"
    flow = (
        sf.Pipeline(name, trigger="300ms")
        .source(f"LIN_{uid}", schema={"id": "long"}, id="src")
        .sink_jetstream(f"LOUT_{uid}", subject=f"lout{uid}", id="out")
    )
    fence = Fence(f"{name}.f0", 1, "n1", str(checkpoints))
    publish(nats_url, f"LIN_{uid}", f"lin{uid}.r", [{"id": i} for i in range(10)])

    def runner() -> PipelineRunner:
        return PipelineRunner(
            spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, fence=fence
        )

    first = runner().start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"LOUT_{uid}")) == 10)
    finally:
        first.stop()
    kept = checkpoints.parent / "kept"
    checkpoints.rename(kept)  # the node's disk is gone

    with pytest.raises(CheckpointLost) as lost:
        runner().start()
    assert f"fragment {name}.f0" in str(lost.value)
    assert str(checkpoints) in str(lost.value) and "batch" in str(lost.value)

    kept.rename(checkpoints)
    publish(nats_url, f"LIN_{uid}", f"lin{uid}.r", [{"id": i} for i in range(10, 15)])
    again = runner().start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"LOUT_{uid}")) == 15)
    finally:
        again.stop()
    ids = Counter(json.loads(data)["id"] for _, data, _ in read_all(nats_url, f"LOUT_{uid}"))
    assert ids == Counter(range(15))
