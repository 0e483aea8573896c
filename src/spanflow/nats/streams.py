"""JetStream helpers shared by the CLI, the runner and the Spark connectors."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

import nats

T = TypeVar("T")

DEFAULT_DUPLICATE_WINDOW = 15 * 60.0
"""Seconds a sink stream remembers message ids. Longer than any restart we expect:
a pipeline that restarts from its checkpoint replays at most the batches since the
last commit, within this window."""


async def connect(url: str, **options: Any) -> Client:
    """Connect with settings suited to a long-lived data-path client."""
    return await nats.connect(
        url,
        connect_timeout=5,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        pending_size=64 * 1024 * 1024,
        **options,
    )


async def ensure_stream(
    js: JetStreamContext,
    name: str,
    subjects: list[str] | None,
    *,
    duplicate_window: float = DEFAULT_DUPLICATE_WINDOW,
    max_age: float | None = None,
) -> None:
    """Create a stream if it is missing; an existing stream is left as it is.

    ``max_age`` (seconds) bounds how long messages are kept; None keeps them until other
    limits or an operator removes them.
    """
    try:
        await js.stream_info(name)
        return
    except NotFoundError:
        pass
    await js.add_stream(
        StreamConfig(
            name=name, subjects=subjects, duplicate_window=duplicate_window, max_age=max_age
        )
    )


class SyncNats:
    """A NATS connection on a private event-loop thread, for synchronous callers.

    Spark calls data-source hooks synchronously; this lets them make many requests
    over one connection instead of connecting per call.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="nats-sync"
        )
        self._thread.start()
        self.nc: Client = self.run(lambda: connect(url))
        self.js: JetStreamContext = self.nc.jetstream()

    def run(self, factory: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
        async def wrapper() -> T:
            return await factory()

        coro: Coroutine[Any, Any, T] = wrapper()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):  # closing is best-effort
            self.run(self.nc.drain, timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
