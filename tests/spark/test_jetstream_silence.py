"""A stream that stops answering (its leader died) reads as "nothing new" for a while."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from nats.js.errors import NotFoundError

from spanflow.nats.streams import connect
from spanflow.spark.connectors import SourceContext
from spanflow.spark.connectors.jetstream.source import JetStreamReader, Silence, source_options
from spanflow.spec.steps.io import SourceStep
from tests.helpers import publish, wait_for


def test_silence_is_tolerated_until_it_lasts_too_long() -> None:
    silence = Silence("stream S", tolerance=10.0)
    timeout = TimeoutError("no answer")
    silence.tolerate(timeout, now=100.0)
    silence.tolerate(timeout, now=109.5)  # an election's length: the query keeps running
    with pytest.raises(TimeoutError):
        silence.tolerate(timeout, now=110.5)


def test_an_answer_ends_the_silence() -> None:
    silence = Silence("stream S", tolerance=10.0)
    silence.tolerate(TimeoutError(), now=100.0)
    silence.answered()
    silence.tolerate(TimeoutError(), now=150.0)  # a new silence: counted from now
    silence.tolerate(TimeoutError(), now=159.0)
    assert silence.since == 150.0


def test_commit_never_waits_for_the_progress_consumer(nats_url, uid, monkeypatch) -> None:
    """Spark starts no batch while a source's commit runs; through an election the
    progress consumer does not answer for seconds. The move goes on in the background
    and ends at the newest position once the consumer answers."""
    publish(nats_url, f"PROG_{uid}", f"prog{uid}.r", [{"i": i} for i in range(30)])
    gate = threading.Event()
    answer = JetStreamReader._ensure_progress_consumer

    async def silent_until_gate(self: JetStreamReader) -> None:
        await asyncio.to_thread(gate.wait, 60)  # the consumer's leader is being elected
        await answer(self)

    monkeypatch.setattr(JetStreamReader, "_ensure_progress_consumer", silent_until_gate)
    step = SourceStep(id="s", stream=f"PROG_{uid}", schema={"i": "long"})
    context = SourceContext(
        spark=None,  # type: ignore[arg-type]  # the reader alone: no query
        nats_url=nats_url,
        pipeline="p",
        query_token="",
        ddl="i BIGINT",
        schema={"i": "long"},
    )
    slot = {"phase_ms": "0", "interval_ms": "1000", "heartbeat": ""}
    reader = JetStreamReader({**source_options(context, step), **slot})
    try:
        began = time.monotonic()
        reader.commit({"seq": 11})
        reader.commit({"seq": 21})
        assert time.monotonic() - began < 1.0  # the gate holds the move for up to 60 s
        gate.set()
        wait_for(lambda: _ack_floor(nats_url, f"PROG_{uid}", reader.consumer) == 20)
    finally:
        gate.set()
        reader.stop()


def _ack_floor(url: str, stream: str, consumer: str) -> int:
    async def go() -> int:
        nc = await connect(url)
        try:
            info = await nc.jetstream().consumer_info(stream, consumer)
            return int(info.ack_floor.stream_seq)
        except NotFoundError:
            return -1
        finally:
            await nc.close()

    return asyncio.run(go())
