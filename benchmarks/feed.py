"""A steady feed of readings published from a thread of its own, for the benchmarks
that run processes and inject faults meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from spanflow.nats.streams import connect, ensure_stream


class SteadyFeed:
    """``rate`` records a second into ``stream`` (made if missing). Each is published
    with its number as message id, again until the server acknowledges it (a fault may
    make publishes fail for a while; JetStream stores each once). Subclasses say what
    record ``n`` is (:meth:`record`) and keep what they need of it (:meth:`published`)."""

    stream = ""
    subjects: tuple[str, ...] = ()

    def __init__(self, url: str, rate: float) -> None:
        self.url, self.rate = url, rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def record(self, n: int, at: float) -> tuple[str, bytes]:
        """The subject and payload of record ``n``, published at ``at`` (epoch seconds)."""
        raise NotImplementedError

    def published(self, n: int, at: float) -> None:
        """Record ``n`` is stored."""

    def start(self) -> SteadyFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _run(self) -> None:
        nc = await connect(self.url)
        js = nc.jetstream()
        await ensure_stream(js, self.stream, list(self.subjects))
        started = time.time()
        while not self._stop.is_set():
            while self.sent < int((time.time() - started) * self.rate):
                at = time.time()
                subject, data = self.record(self.sent, at)
                await publish_until_stored(js, subject, data, str(self.sent))
                self.published(self.sent, at)
                self.sent += 1
            await asyncio.sleep(0.01)
        await nc.close()


async def publish_until_stored(js: Any, subject: str, data: bytes, msg_id: str) -> None:
    """Publish until acknowledged, with ``msg_id`` so that a retry is stored once. Each
    try waits a second for its ack, as a device that wants its readings through a NATS
    server's death soon should (nats-py's default, 5 s, would add up to 5 s to the
    stall after a stream's leader election)."""
    while True:
        try:
            await js.publish(subject, data, headers={"Nats-Msg-Id": msg_id}, timeout=1)
            return
        except Exception:
            await asyncio.sleep(0.2)
