"""Read an exact range of a stream's sequence numbers, fast.

Spark's exactly-once contract needs ``read(start, end)`` to return the same messages
every time it is asked for the same range. We replay with an ordered push consumer
that starts at ``start`` (≈200k msg/s in nats-py, against ≈40k for a pull ``fetch``)
and stop at the first sequence at or beyond ``end``. Gaps (deleted messages) are fine:
a message's ``num_pending`` tells when nothing more is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from spanflow.nats.streams import subject_covers
from spanflow.protocol.raw import RawRecord


def _ack_fields(reply: str) -> tuple[int, int, int]:
    """(stream seq, timestamp ns, pending) from a JetStream ack subject.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` (v1) or the
    v2 form with domain and account hash before the stream (12+ tokens).
    """
    t = reply.split(".")
    if len(t) == 9:
        return int(t[5]), int(t[7]), int(t[8])
    return int(t[7]), int(t[9]), int(t[10])


async def read_range(
    nc: Client,
    stream: str,
    start: int,
    end: int,
    *,
    subjects: Sequence[str] = (),
    idle_check: float = 2.0,
) -> list[RawRecord]:
    """Messages with ``start <= seq < end`` in sequence order (only those on ``subjects``,
    when given: filtered here, so the end of the range is still seen).

    A read cut short by a lagging server (:class:`RangeCutShort`, just after a leader
    election) is tried again a few times before the error reaches the caller."""
    for pause in CUT_SHORT_PAUSES:
        try:
            return await _read_range_once(
                nc, stream, start, end, subjects=subjects, idle_check=idle_check
            )
        except RangeCutShort:
            await asyncio.sleep(pause)
    return await _read_range_once(nc, stream, start, end, subjects=subjects, idle_check=idle_check)


CUT_SHORT_PAUSES = (0.2, 0.5, 1.0, 2.0)
"""Waits between reads of a range cut short: a new stream leader's followers catch up
within a few seconds."""


async def _read_range_once(
    nc: Client,
    stream: str,
    start: int,
    end: int,
    *,
    subjects: Sequence[str],
    idle_check: float,
) -> list[RawRecord]:
    if end <= start:
        return []
    js = nc.jetstream()
    out: list[RawRecord] = []
    done = asyncio.Event()
    last_seen = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal last_seen
        if done.is_set():
            return
        seq, ts_ns, pending = _ack_fields(msg.reply)
        if seq >= end:
            done.set()
            return
        last_seen = seq
        if not subjects or any(subject_covers(p, msg.subject) for p in subjects):
            out.append(RawRecord(seq, msg.subject, msg.data, ts_ns // 1000))
        if seq >= end - 1 or pending == 0:
            done.set()  # pending 0 may be a lagging server's word: checked below

    sub = await js.subscribe(
        ">",
        stream=stream,
        cb=on_msg,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        config=ConsumerConfig(opt_start_seq=start),
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=512 * 1024 * 1024,
    )
    try:
        while not done.is_set():
            before = last_seen
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), idle_check)
            if done.is_set() or last_seen != before:
                continue
            # No progress: the rest of the range may have been deleted.
            state = (await js.stream_info(stream)).state
            if state.last_seq < max(start, last_seen + 1) or state.first_seq >= end:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if last_seen < end - 1:
        await ensure_range_complete(js, stream, max(start, last_seen + 1), end)
    return out


class RangeCutShort(ConnectionError):
    """A range read ended before a message its stream's leader holds: tried again."""


async def ensure_range_complete(
    js: Any, stream: str, after: int, end: int, subject: str | None = None
) -> None:
    """Raise :class:`RangeCutShort` if the stream's leader holds a message with
    ``after <= seq < end`` (on ``subject`` when given).

    A consumer with one replica lives on one server; after a leader election that
    server may be a follower still catching up, and its consumer then reports nothing
    pending before the range's end. Taking its word would lose readings silently (a
    window counted short: ``tests/spark/test_nats_failover.py``); the stream's next
    message, asked of the leader, tells."""
    if after >= end:
        return
    try:
        msg = await js.get_msg(stream, seq=after, subject=subject, next=True)
    except NotFoundError:
        return
    if msg.seq is not None and msg.seq < end:
        raise RangeCutShort(
            f"the range reader's consumer on {stream} stopped before sequence {msg.seq} "
            f"of [{after}, {end}): its server is behind the stream's leader (a leader "
            "election); reading again"
        )


async def last_before(
    nc: Client, stream: str, seq: int, *, subjects: Sequence[str] = (), look_back: int = 64
) -> RawRecord | None:
    """The newest stored message with a sequence below ``seq`` (on ``subjects`` when
    given), looking back at most ``look_back`` sequences; None if there is none."""
    js = nc.jetstream()
    for candidate in range(seq - 1, max(0, seq - 1 - look_back), -1):
        try:
            raw = await js.get_msg(stream, seq=candidate)
        except NotFoundError:
            continue
        subject = raw.subject or ""
        if subjects and not any(subject_covers(s, subject) for s in subjects):
            continue
        published = raw.time.timestamp() if raw.time else 0.0
        return RawRecord(candidate, subject, raw.data or b"", round(published * 1_000_000))
    return None
