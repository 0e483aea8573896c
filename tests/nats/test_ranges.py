"""Range replay must return exactly the stored messages of [start, end), every time."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import StreamConfig

from spanflow.nats.fastread import read_range_fast
from spanflow.nats.ranges import read_range
from spanflow.nats.streams import connect


@pytest.fixture(scope="module")
def loaded(nats_url):
    """Stream R: 500 messages, some with headers, seqs 100-109 and 500 deleted."""

    async def go() -> None:
        nc = await connect(nats_url)
        js = nc.jetstream()
        # not ensure_stream: spanflow's own streams refuse single-message deletes
        await js.add_stream(StreamConfig(name="RANGES", subjects=["ranges.>"]))
        for i in range(1, 501):
            headers = {"Nats-Msg-Id": f"m{i}", "X-Extra": "v"} if i % 7 == 0 else None
            await js.publish(f"ranges.k{i % 3}", f"payload {i}".encode(), headers=headers)
        for seq in (*range(100, 110), 500):
            await js.delete_msg("RANGES", seq)
        await nc.close()

    asyncio.run(go())
    return nats_url


def _read(url: str, start: int, end: int, fast: bool) -> list[tuple[int, str, bytes]]:
    async def go() -> list[tuple[int, str, bytes]]:
        nc = await connect(url)
        try:
            if fast:
                msgs = await read_range_fast(nc, url, "RANGES", start, end, idle_check=0.5)
            else:
                msgs = await read_range(nc, "RANGES", start, end, idle_check=0.5)
        finally:
            await nc.close()
        return [(m.seq, m.subject, m.data) for m in msgs]

    return asyncio.run(go())


def _expected(start: int, end: int) -> list[tuple[int, str, bytes]]:
    deleted = {*range(100, 110), 500}
    return [
        (s, f"ranges.k{s % 3}", f"payload {s}".encode())
        for s in range(start, min(end, 501))
        if s not in deleted
    ]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "nats-py"])
@pytest.mark.parametrize(
    ("start", "end"), [(1, 501), (1, 2), (50, 150), (100, 110), (95, 105), (480, 501), (300, 300)]
)
def test_range_is_exact_and_repeatable(loaded, start, end, fast):
    first = _read(loaded, start, end, fast)
    assert first == _expected(start, end)
    assert _read(loaded, start, end, fast) == first


def test_headers_do_not_leak_into_payloads(loaded):
    msgs = _read(loaded, 7, 8, True)
    assert msgs == [(7, "ranges.k1", b"payload 7")]


def test_fast_reader_leaves_no_consumers_behind(loaded):
    async def consumers() -> int:
        nc = await connect(loaded)
        info = await nc.jetstream().stream_info("RANGES")
        await nc.close()
        return info.state.consumer_count

    before = asyncio.run(consumers())
    _read(loaded, 1, 200, True)
    assert asyncio.run(consumers()) == before


def test_a_consumer_stopping_short_of_its_range_is_told_by_the_leader(nats_url: str) -> None:
    """After an election a range reader's consumer may sit on a follower still catching
    up and report nothing pending before its range ends: the stream's leader says
    whether a message of the range is still to come; deleted messages are not."""
    import asyncio

    from nats.js.api import StreamConfig

    from spanflow.nats.ranges import RangeCutShort, ensure_range_complete
    from spanflow.nats.streams import connect

    async def cut_short(js: object, after: int, subject: str | None = None) -> bool:
        try:
            await ensure_range_complete(js, "SHORT", after, 11, subject)
            return False
        except RangeCutShort:
            return True

    async def go() -> list[bool]:
        nc = await connect(nats_url)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="SHORT", subjects=["short.>"]))
        for i in range(10):
            await js.publish(f"short.{'a' if i < 8 else 'b'}", b"{}")  # seqs 1..10
        seen = [
            await cut_short(js, 6),  # 6..10 still to come
            await cut_short(js, 11),  # the whole range read
            await cut_short(js, 9, "short.a"),  # only short.b is left
            await cut_short(js, 6, "short.b"),  # 9 and 10 are short.b
        ]
        for seq in range(6, 11):
            await js.delete_msg("SHORT", seq)
        seen.append(await cut_short(js, 6))  # deleted: nothing to come
        await nc.close()
        return seen

    assert asyncio.run(go()) == [True, False, False, True, False]
