"""Exactly once whatever the outage: each JetStream sink's ledger of published batches.

A sink's messages carry ids derived from their batch and content, and JetStream drops
a message whose id it saw within the stream's duplicate window. That alone covers a
fragment restarted within the window (15 minutes for streams spanflow creates, two
for streams a user made): it replays its last, uncommitted batch and every message
of it is dropped. An edge node down for an hour would publish that batch again.

So every sink also keeps a *mark* in the fences bucket of the server it writes to
(the same store as its fence, with as many copies), keyed by its checkpoint: ``{batch,
end_seq}``, a batch published in full and the stream's highest sequence among its
acks. The mark is written when the sink starts (``batch -1``: the stream's end before
anything of this sink), after its first published batch (so a checkpoint lost from then
on is noticed, :func:`lost_checkpoint`) and after a published batch at most every
:data:`MARK_EVERY` seconds, so it costs one small KV write per interval, not per batch.

Spark replays only a query's last uncommitted batch, and only as the first batch a
(re)started query runs. So the first batch a ledger sees (:func:`plan`):

* is the marked batch → it was published in full: nothing is published again;
* else → the stream is read from ``end_seq + 1`` (headers only, the sink's subjects)
  and only the messages whose ids are not there are published (all of them when the
  batch is new; the rest when a node died mid-publish).

Every later batch in the same process is new: published whole, no read. Decisions are
pure (:func:`plan`); :class:`SinkLedger` is the thin I/O shell.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from enum import StrEnum

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

SCAN_WAIT = 1.0
"""Seconds a read of the stream waits for more before it counts as the end."""
MARK_EVERY = 2.0
"""Seconds between two marks of a running sink: a restart reads at most this much of
the sink's output back (plus the batch in flight)."""


class Mark(BaseModel):
    """The last batch of a sink known published in full."""

    batch: int
    end_seq: int
    """The stream's highest sequence among the batch's acks (or the stream's end)."""


class Action(StrEnum):
    PUBLISH = "publish"  # a new batch in a running process: publish it whole
    SKIP = "skip"  # published in full before: publish nothing
    CHECK = "check"  # maybe published in part before: publish what the stream lacks


def plan(mark: Mark | None, batch: int, first: bool) -> Action:
    """What to do with ``batch``; ``first``: the first batch this process publishes."""
    if mark is not None and mark.batch == batch:
        return Action.SKIP
    return Action.CHECK if first and mark is not None else Action.PUBLISH


def lost_checkpoint(mark: Mark | None, has_offsets: bool) -> bool:
    """Whether a sink published a batch from a checkpoint that no longer has offsets:
    a checkpoint lost or damaged, never a fresh start."""
    return mark is not None and mark.batch >= 0 and not has_offsets


def ledger_key(checkpoint: str) -> str:
    """The ledger's key for a sink: its checkpoint location, digested (one per query,
    the same after a restart or a move)."""
    return "sink." + hashlib.blake2b(checkpoint.encode(), digest_size=10).hexdigest()


class SinkLedger:
    """One JetStream sink's ledger (see the module doc)."""

    def __init__(
        self, nc: Client, kv: KeyValue, stream: str, subjects: str, checkpoint: str
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.kv = kv
        self.stream = stream
        self.subjects = subjects
        self.key = ledger_key(checkpoint)
        self._mark: Mark | None = None
        self._first = True
        self._marked_at = float("-inf")
        self._pending: Mark | None = None
        """Published in full but not marked yet (marks are written every MARK_EVERY)."""
        self.skipped = 0
        """Replayed batches found published in full."""
        self.checked = 0
        """First batches checked against the stream (restarts)."""

    async def published_before(self, batch: int, ids: Callable[[], list[str]]) -> set[str]:
        """The ids of batch ``batch``'s messages the stream already holds: publish the
        rest. ``ids`` lists the batch's message ids; it is called only when the batch
        may have been published before (the first batch after a restart)."""
        first = self._first  # cleared only once answered: a call cut short is tried again
        if first:
            self._mark = await self._read()
            if self._mark is None:  # a new sink: where its output will start
                info = await self.js.stream_info(self.stream)
                await self._write(Mark(batch=-1, end_seq=int(info.state.last_seq)))
        action = plan(self._mark, batch, first)
        stored: set[str] = set()
        if action is Action.SKIP:
            stored = set(ids())
        elif action is Action.CHECK:
            assert self._mark is not None
            stored = await self._stored_ids(self._mark.end_seq + 1, set(ids()))
        self._first = False
        self.skipped += action is Action.SKIP
        self.checked += action is Action.CHECK
        return stored

    async def mark(self) -> Mark | None:
        """The sink's last mark in the store (None: it never published)."""
        return await self._read()

    async def after(self, batch: int, last_seq: int) -> None:
        """Batch ``batch`` is published in full; ``last_seq``: its highest ack."""
        end = max(last_seq, self._mark.end_seq if self._mark is not None else 0)
        self._pending = Mark(batch=batch, end_seq=end)
        first_published = self._mark is None or self._mark.batch < 0
        if first_published or time.monotonic() - self._marked_at >= MARK_EVERY:
            await self._write(self._pending)

    async def _write(self, mark: Mark) -> None:
        await self.kv.put(self.key, mark.model_dump_json().encode())
        self._mark, self._pending, self._marked_at = mark, None, time.monotonic()

    async def _read(self) -> Mark | None:
        try:
            entry = await self.kv.get(self.key)
        except KeyNotFoundError:
            return None
        try:
            return Mark.model_validate_json(entry.value or b"")
        except ValidationError:
            return None  # unreadable: a new start (the duplicate window still helps)

    async def _stored_ids(self, start_seq: int, wanted: set[str]) -> set[str]:
        """Ids among ``wanted`` that the stream holds from ``start_seq`` on (read with
        headers only, the sink's subjects; a pull that times out: nothing more)."""
        found: set[str] = set()
        sub = await self.js.pull_subscribe(
            self.subjects,
            stream=self.stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=start_seq,
                headers_only=True,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=30.0,
            ),
        )
        try:
            if (await sub.consumer_info()).num_pending == 0:
                return found
            while True:
                try:
                    batch = await sub.fetch(1000, timeout=SCAN_WAIT)
                except TimeoutError:
                    break
                for msg in batch:
                    msg_id = (msg.headers or {}).get("Nats-Msg-Id")
                    if msg_id in wanted:
                        found.add(msg_id)
                if not batch or batch[-1].metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return found
