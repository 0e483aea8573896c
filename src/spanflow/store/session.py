"""One JetStream context for the length of a piece of work, from async or sync code
(Spark's Python workers call in from plain functions)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.js.client import JetStreamContext

from spanflow.nats.streams import connect
from spanflow.nats.sync import run_sync

T = TypeVar("T")
JetStream = JetStreamContext
"""The handle a store is built on (opaque to the packages that use the stores)."""

__all__ = ["JetStream", "run_sync", "run_with_jetstream", "with_jetstream"]


async def with_jetstream(url: str, work: Callable[[JetStream], Awaitable[T]]) -> T:
    """Run ``work`` with a JetStream context over a fresh connection to ``url``."""
    nc = await connect(url)
    try:
        return await work(nc.jetstream())
    finally:
        await nc.close()


def run_with_jetstream(url: str, work: Callable[[JetStream], Awaitable[T]]) -> T:
    """:func:`with_jetstream` from synchronous code."""
    return run_sync(with_jetstream(url, work))
