"""A TCP relay that plays the WAN between two sites: delay, a cut uplink, byte counts.

These machines have no ``tc netem``, so a one-machine cluster puts this relay between
an edge site's NATS server and the hub's leaf-node port. It adds a one-way delay in
each direction (without limiting throughput: every chunk is held until its own send
time), can cut the link (every connection closed, new ones refused) and restore it,
and counts the bytes that cross — the WAN traffic a placement costs.

>>> relay = WanRelay("127.0.0.1", 1, delay=0.015)
>>> relay.delay, relay.is_cut
(0.015, False)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from typing import Any


class WanRelay:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port`` in a background thread."""

    def __init__(self, target_host: str, target_port: int, *, delay: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.port = 0
        self.bytes_up = 0  # client → target (edge → hub)
        self.bytes_down = 0
        self.is_cut = False
        self.is_silent = False
        """The cable pulled (:meth:`silence`): bytes held, nothing closed."""
        self._flowing: asyncio.Event | None = None
        self.tally: dict[str, int] | None = None
        """Set to ``{}`` to count bytes per subject prefix of leaf-node messages (debug)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> WanRelay:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", 0)
            )
            self._flowing = asyncio.Event()
            self._flowing.set()
            self.port = int(self._server.sockets[0].getsockname()[1])
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="wan-relay")
        self._thread.start()
        ready.wait(10)
        return self

    @property
    def url(self) -> str:
        """The ``nats-leaf://`` URL an edge server uses to reach the hub through the relay."""
        return f"nats-leaf://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._loop is None:
            return
        loop = self._loop
        self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None

    def cut(self) -> None:
        """Drop the link: open connections are closed and new ones refused."""
        self.is_cut = True
        self._call(self._close_all())

    def silence(self) -> None:
        """Pull the cable without telling anyone: no connection is closed, nothing is
        refused, but no byte gets through (each is held, as TCP retransmits) until
        :meth:`restore` — what a dead host or a dropped route does, unlike :meth:`cut`,
        whose closed connections the clients notice at once."""
        self.is_silent = True
        self._set_flowing(False)

    def restore(self) -> None:
        self.is_cut = False
        self.is_silent = False
        self._set_flowing(True)

    def _set_flowing(self, flowing: bool) -> None:
        loop, event = self._loop, self._flowing
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set if flowing else event.clear)

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._loop is None:
            coro.close()
            return
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _shutdown(self) -> None:
        """Close the listener and every connection, then let the piping tasks see the
        end of their streams, so the loop stops with nothing pending ("Task was
        destroyed but it is pending")."""
        if self._flowing is not None:
            self._flowing.set()  # held bytes go nowhere now, but their senders must end
        if self._server is not None:
            self._server.close()
        await self._close_all()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    async def _close_all(self) -> None:
        for w in list(self._writers):
            w.close()
            with contextlib.suppress(Exception):
                await w.wait_closed()
        self._writers.clear()

    # -- data path --------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            writer.close()
            return
        assert self._flowing is not None
        await self._flowing.wait()  # a silent cable: the connection hangs, unanswered
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer, up=True),
            self._pipe(up_reader, writer, up=False),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    def _count(self, chunk: bytes, up: bool) -> None:
        assert self.tally is not None
        for line in chunk.split(b"\r\n"):
            if line[:5] in (b"LMSG ", b"RMSG ", b"HMSG "):
                parts = line.split(b" ")
                subject = parts[1].decode(errors="replace")
                prefix = 1 if subject.startswith("_INBOX.") else 3
                key = ("up " if up else "down ") + ".".join(subject.split(".")[:prefix])
                try:
                    size = int(parts[-1])
                except ValueError:
                    size = 0
                self.tally[key] = self.tally.get(key, 0) + size + len(line)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool
    ) -> None:
        """Copy one direction; with a delay, a sender task releases chunks in order at
        their arrival time + delay, so the delay adds latency but not a rate limit."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def send() -> None:
            while (item := await queue.get()) is not None:
                due, chunk = item
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                assert self._flowing is not None
                await self._flowing.wait()
                writer.write(chunk)
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(send())
        try:
            while chunk := await reader.read(1 << 16):
                if up:
                    self.bytes_up += len(chunk)
                else:
                    self.bytes_down += len(chunk)
                if self.tally is not None:
                    self._count(chunk, up)
                queue.put_nowait((time.monotonic() + self.delay, chunk))
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await sender
