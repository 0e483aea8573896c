"""Exactly once whatever the outage (nats/ledger.py): a fragment that died after
publishing a batch — in full, or in part — and restarts long after its sink stream's
duplicate window replays that batch without a duplicate and without a loss."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from nats.js.api import StreamConfig

import spanflow as sf
from spanflow.nats import ledger as ledger_module
from spanflow.nats.ledger import Action, Mark, SinkLedger, plan
from spanflow.nats.streams import connect
from spanflow.spark.connectors.jetstream import sink as sink_module
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, wait_for

WINDOW = 1.0
"""The sink stream's duplicate window (a user's stream; NATS's default is 2 minutes)."""


def test_plan() -> None:
    assert plan(None, 0, first=True) is Action.PUBLISH  # a new sink
    assert plan(Mark(batch=3, end_seq=9), 3, first=True) is Action.SKIP  # done before
    assert plan(Mark(batch=2, end_seq=9), 3, first=True) is Action.CHECK  # maybe in part
    assert plan(Mark(batch=2, end_seq=9), 3, first=False) is Action.PUBLISH  # new batch


def _short_window_stream(url: str, name: str, subject: str) -> None:
    async def go() -> None:
        nc = await connect(url)
        await nc.jetstream().add_stream(
            StreamConfig(name=name, subjects=[subject], duplicate_window=WINDOW)
        )
        await nc.close()

    asyncio.run(go())


class Crashes:
    """Wraps the sink's publish: the batch numbered ``at`` (counting non-empty ones)
    dies after publishing half (``"half"``) or all (``"all"``) of its messages, before
    the ledger records it done; with ``"recorded"`` it dies after that, before Spark
    commits the batch."""

    def __init__(self, real: Callable[..., Any], how: str, at: int = 2) -> None:
        self.real, self.how, self.at, self.calls = real, how, at, 0
        self.crashed = False

    def publish(self, sink: Any, batch: Any, skip: set[str]) -> Any:
        self.calls += 1
        if self.calls != self.at or self.how == "recorded":
            return self.real(sink, batch, skip)
        ids = batch.ids()
        second_half = set() if self.how == "all" else set(ids[len(ids) // 2 :])
        self.real(sink, batch, skip | second_half)
        self.crashed = True
        raise RuntimeError(f"injected crash after publishing {self.how} of a batch")

    def after(self, real_after: Callable[..., Any]) -> Callable[..., Any]:
        async def after(ledger: SinkLedger, batch: int, last_seq: int) -> None:
            await real_after(ledger, batch, last_seq)
            if self.how == "recorded" and self.calls == self.at and not self.crashed:
                self.crashed = True
                raise RuntimeError("injected crash after the batch was recorded published")

        return after


def _failed(runner: PipelineRunner) -> bool:
    return any(s.query is not None and not s.query.isActive for s in runner._queries.values())


@pytest.mark.parametrize(
    ("how", "replay"), [("half", "checked"), ("all", "checked"), ("recorded", "skipped")]
)
def test_a_batch_replayed_after_the_duplicate_window_is_published_once(
    spark, nats_url, checkpoints, uid, monkeypatch, how, replay
) -> None:
    source, sink = f"LIN_{how}_{uid}", f"LOUT_{how}_{uid}"
    subject = f"lout{how}{uid}"
    _short_window_stream(nats_url, sink, subject)
    flow = (
        sf.Pipeline(f"ledger-{how}-{uid}", trigger="200ms")
        .source(source, schema={"id": "long"}, subjects=[f"lin{how}{uid}.>"], id="src")
        .sink_jetstream(sink, subject=subject, id="out")
    )
    # every published batch marked at once: the crash after the mark then finds it
    monkeypatch.setattr(ledger_module, "MARK_EVERY", 0.0)
    crashes = Crashes(sink_module.publish_batch, how)
    monkeypatch.setattr(sink_module, "publish_batch", crashes.publish)
    monkeypatch.setattr(SinkLedger, "after", crashes.after(SinkLedger.after))
    publish(nats_url, source, f"lin{how}{uid}.r", [{"id": i} for i in range(20)])
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        wait_for(lambda: len(read_all(nats_url, sink)) >= 20)
        publish(nats_url, source, f"lin{how}{uid}.r", [{"id": i} for i in range(20, 40)])
        # batch 2 dies after its publish; the query fails and waits to be restarted
        wait_for(lambda: crashes.crashed and _failed(runner), timeout=60)
        time.sleep(WINDOW * 3)  # the outage: longer than the stream's duplicate window

        def replayed() -> bool:
            runner.supervise()  # restarts the failed query from its checkpoint
            ledger = runner.writers["out"].ledger  # type: ignore[attr-defined]
            return not _failed(runner) and ledger.skipped + ledger.checked > 0

        wait_for(replayed, timeout=60)
        wait_for(lambda: len(read_all(nats_url, sink)) >= 40)
        runner.await_idle()
        ledger = runner.writers["out"].ledger  # type: ignore[attr-defined]
    finally:
        runner.stop()
    ids = Counter(json.loads(data)["id"] for _, data, _ in read_all(nats_url, sink))
    assert ids == Counter(range(40))
    assert (ledger.skipped, ledger.checked) == ((1, 0) if replay == "skipped" else (0, 1))


def test_a_first_check_cut_short_is_checked_again_when_retried(nats_url: str) -> None:
    """A restart's first batch is checked against the stream; if that call is cut short
    (its bucket elected a leader) and tried again, the retry must check too — not take
    the batch for a new one and publish it twice."""

    async def go() -> tuple[set[str], set[str]]:
        nc = await connect(nats_url)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="LEDGER_CUT", subjects=["ledgercut"]))
        kv = await js.create_key_value(bucket="ledger_cut_fences")
        ids = [f"p:s:5:driver:{n}:0" for n in range(4)]
        for msg_id in ids[:2]:  # batch 5 was half published before the crash
            await js.publish("ledgercut", b"{}", headers={"Nats-Msg-Id": msg_id})
        first = SinkLedger(nc, kv, "LEDGER_CUT", "ledgercut", "/ckpt/cut")
        await first._write(Mark(batch=4, end_seq=0))
        restarted = SinkLedger(nc, kv, "LEDGER_CUT", "ledgercut", "/ckpt/cut")
        calls = 0

        def cut_once() -> list[str]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise TimeoutError("cut short")
            return ids

        with pytest.raises(TimeoutError):
            await restarted.published_before(5, cut_once)
        again = await restarted.published_before(5, cut_once)
        fresh = SinkLedger(nc, kv, "LEDGER_CUT", "ledgercut", "/ckpt/cut")
        expected = await fresh.published_before(5, lambda: ids)
        await nc.close()
        return again, expected

    again, expected = asyncio.run(go())
    assert again == expected == {"p:s:5:driver:0:0", "p:s:5:driver:1:0"}
