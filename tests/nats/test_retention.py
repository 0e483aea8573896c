"""Bounded streams: every stream spanflow creates has limits, what happens when one is
full is the one configured (refuse new, or drop the oldest), and usage says when a
stream nears its limit. Real NATS server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from spanflow.nats.streams import connect, ensure_sourced, ensure_stream, stream_usage
from spanflow.spec.retention import DEFAULT_RETENTION, Retention
from spanflow.spec.topology import Topology

SMALL = 4096


def run(url: str, body: Callable[[Any], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        nc = await connect(url)
        try:
            return await body(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(go())


def test_a_new_stream_gets_the_default_limits(nats_url: str, uid: str) -> None:
    name = f"RET_DEFAULT_{uid}"

    async def body(js: Any) -> StreamConfig:
        await ensure_stream(js, name, [f"ret.{uid}.default.>"])
        return (await js.stream_info(name)).config

    config = run(nats_url, body)
    assert config.max_age == DEFAULT_RETENTION.max_age == 7 * 86400
    assert config.max_bytes == -1  # no size of its own: JetStream would reserve it
    assert config.discard == "new"


def test_a_full_stream_refuses_new_messages_and_keeps_the_acknowledged(
    nats_url: str, uid: str
) -> None:
    name, subject = f"RET_NEW_{uid}", f"ret.{uid}.new"
    limits = Retention(max_bytes=SMALL, discard="new")

    async def body(js: Any) -> tuple[list[int], int, Any]:
        await ensure_stream(js, name, [subject], retention=limits)
        acked: list[int] = []
        with pytest.raises(APIError, match="maximum bytes exceeded"):
            for i in range(1000):
                ack = await js.publish(subject, b"x" * 100, headers={"n": str(i)})
                acked.append(ack.seq)
        info = await js.stream_info(name)
        return acked, int(info.state.first_seq), await stream_usage(js, name)

    acked, first, usage = run(nats_url, body)
    assert 10 < len(acked) < 100
    assert first == 1  # nothing acknowledged was dropped
    assert usage.messages == len(acked) and usage.bytes <= SMALL
    assert usage.warning is not None and "refuses new messages" in usage.warning


def test_a_full_stream_with_discard_old_drops_the_oldest(nats_url: str, uid: str) -> None:
    name, subject = f"RET_OLD_{uid}", f"ret.{uid}.old"

    async def body(js: Any) -> tuple[int, int, Any]:
        await ensure_stream(
            js, name, [subject], retention=Retention(max_bytes=SMALL, discard="old")
        )
        for _ in range(200):
            await js.publish(subject, b"x" * 100)
        info = await js.stream_info(name)
        return int(info.state.first_seq), int(info.state.last_seq), await stream_usage(js, name)

    first, last, usage = run(nats_url, body)
    assert last == 200 and first > 1  # the oldest made room
    assert usage.bytes <= SMALL and "drops the oldest" in (usage.warning or "")


def test_an_unbounded_stream_made_before_gets_limits_and_a_bounded_one_keeps_its_own(
    nats_url: str, uid: str
) -> None:
    old, own = f"RET_OLDSTYLE_{uid}", f"RET_OWN_{uid}"

    async def body(js: Any) -> tuple[StreamConfig, StreamConfig]:
        await js.add_stream(StreamConfig(name=old, subjects=[f"ret.{uid}.a"]))
        await js.add_stream(StreamConfig(name=own, subjects=[f"ret.{uid}.b"], max_bytes=1 << 20))
        await ensure_stream(js, old, [f"ret.{uid}.a"])
        await ensure_stream(js, own, [f"ret.{uid}.b", f"ret.{uid}.c"])
        return (await js.stream_info(old)).config, (await js.stream_info(own)).config

    bounded, kept = run(nats_url, body)
    assert bounded.max_age == DEFAULT_RETENTION.max_age
    assert kept.max_bytes == 1 << 20 and not kept.max_age  # the operator's limits stay
    assert sorted(kept.subjects or []) == [f"ret.{uid}.b", f"ret.{uid}.c"]


def test_streams_spanflow_makes_refuse_purges_and_deletes_even_from_an_administrator(
    nats_url: str, uid: str
) -> None:
    """A stolen agent host may create and extend streams, so the streams themselves
    refuse a purge or a message delete (for anyone: this client has every right), and
    a stream made before (plain) becomes so at its next ensure; retention still works."""
    new, old, sourced = f"AO_NEW_{uid}", f"AO_OLD_{uid}", f"AO_SRC_{uid}"

    async def body(js: Any) -> list[str]:
        await ensure_stream(js, new, [f"ao.{uid}.new"])
        await js.add_stream(StreamConfig(name=old, subjects=[f"ao.{uid}.old"]))
        await ensure_stream(js, old, [f"ao.{uid}.old"])
        await ensure_sourced(js, sourced, "nowhere")
        refusals = []
        for name in (new, old):
            await js.publish(f"ao.{uid}.{name.split('_')[1].lower()}", b"reading")
            for attempt in (js.purge_stream(name), js.delete_msg(name, 1)):
                with pytest.raises(APIError) as refused:
                    await attempt
                refusals.append(str(refused.value.description))
            assert (await js.stream_info(name)).state.messages == 1
            with pytest.raises(APIError, match="can not cancel deny purge"):
                await js.update_stream(
                    replace((await js.stream_info(name)).config, deny_purge=False)
                )
        with pytest.raises(APIError, match="purge not permitted"):
            await js.purge_stream(sourced)
        return refusals

    refusals = run(nats_url, body)
    assert refusals == ["stream purge not permitted", "message delete not permitted"] * 2


def test_many_streams_with_default_limits_fit_on_one_server(nats_url: str, uid: str) -> None:
    """JetStream reserves a stream's max_bytes up front: the default gives none, so a
    site's dozens of streams never run out of reservable disk."""

    async def body(js: Any) -> int:
        for i in range(30):
            await ensure_stream(js, f"RET_MANY_{uid}_{i}", [f"ret.{uid}.many.{i}"])
        return len([n async for n in _names(js, f"RET_MANY_{uid}_")])

    assert run(nats_url, body) == 30


async def _names(js: Any, prefix: str) -> Any:
    for name in await js.streams_info():
        if name.config.name.startswith(prefix):
            yield name.config.name


def test_usage_is_quiet_below_the_warning_mark(nats_url: str, uid: str) -> None:
    name, subject = f"RET_QUIET_{uid}", f"ret.{uid}.quiet"

    async def body(js: Any) -> Any:
        await ensure_stream(js, name, [subject], retention=Retention(max_bytes=1 << 20))
        await js.publish(subject, b"x" * 100)
        return await stream_usage(js, name), await stream_usage(js, f"NO_SUCH_{uid}")

    usage, missing = run(nats_url, body)
    assert usage.messages == 1 and usage.ratio is not None and usage.ratio < 0.01
    assert usage.warning is None and missing is None


def test_sites_and_hosted_streams_set_their_limits_in_the_topology() -> None:
    topo = Topology.model_validate(
        {
            "sites": [
                {"name": "ship", "retention": {"max_age": "30d", "max_bytes": "200GiB"}},
                {"name": "cloud", "kind": "cloud"},
            ],
            "nodes": [
                {
                    "name": "n1",
                    "site": "ship",
                    "streams": [
                        {
                            "name": "GPS",
                            "subjects": ["gps.>"],
                            "retention": {"max_bytes": "1g", "discard": "old"},
                        }
                    ],
                }
            ],
        }
    )
    ship, cloud = topo.sites
    assert ship.retention.max_age == 30 * 86400 and ship.retention.max_bytes == 200 * 1024**3
    assert cloud.retention == DEFAULT_RETENTION
    gps = topo.nodes[0].streams[0].retention
    assert gps is not None and gps.discard == "old" and gps.max_bytes == 1024**3


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"max_bytes": "lots"}, "expected a size like '512MiB'"),
        ({"max_bytes": 0}, "a size must be positive"),
        ({"discard": "oldest"}, "'new' or 'old'"),
        ({"max_age": "forever"}, "expected a duration"),
    ],
)
def test_bad_limits_are_refused_naming_the_problem(given: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Retention.model_validate(given)
