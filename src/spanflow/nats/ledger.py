"""Exactly once whatever the outage: each JetStream sink's ledger of published batches.

A sink's messages carry ids derived from their batch and content, and JetStream drops
a message whose id it saw within the stream's duplicate window. That alone covers a
fragment restarted within the window (15 minutes for streams spanflow creates, two
for streams a user made): it replays its last, uncommitted batch and every message
of it is dropped. An edge node down for an hour would publish that batch again.

So every sink also keeps a *ledger* entry, in the fences bucket of the server it
writes to (the same store as its fence, with as many copies), keyed by its checkpoint:
before a batch it writes ``{batch, done: false, start_seq}`` (the stream's next
sequence), after the batch's last ack ``{batch, done: true}``. A batch replayed
later (:func:`plan`):

* recorded done → nothing is published again (Spark then commits it);
* recorded open (the node died mid-publish) → the stream is read from ``start_seq``
  (headers only, the sink's subjects) and only the messages whose ids are not there
  are published;
* otherwise → published whole.

Costs per non-empty batch: two small KV writes and a stream-info call. Decisions are
pure (:func:`plan`, :func:`missing`); :class:`SinkLedger` is the thin I/O shell.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

Encoded = list[tuple[str, bytes, str]]
"""(subject, payload, Nats-Msg-Id) per message (:func:`spanflow.spark.jetstream.encode_rows`)."""


SCAN_WAIT = 1.0
"""Seconds a read of the stream waits for more before it counts as the end."""


class Mark(BaseModel):
    """A sink's last batch, as recorded."""

    batch: int
    done: bool
    start_seq: int
    """The stream's next sequence before the batch's first publish."""
    count: int = 0


class Action(StrEnum):
    PUBLISH = "publish"  # never recorded: publish the whole batch
    SKIP = "skip"  # published in full before: publish nothing
    RESUME = "resume"  # published in part: publish what the stream lacks


def plan(mark: Mark | None, batch: int) -> Action:
    if mark is None or mark.batch != batch:
        return Action.PUBLISH
    return Action.SKIP if mark.done else Action.RESUME


def missing(out: Encoded, stored_ids: set[str]) -> Encoded:
    """The messages of ``out`` whose ids the stream does not hold."""
    return [m for m in out if m[2] not in stored_ids]


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
        """The last mark written or read: this process is the sink's only writer."""
        self.skipped = 0
        """Batches found published in full (replays after an outage)."""
        self.resumed = 0

    async def before(self, batch: int, out: Encoded) -> Encoded:
        """What of batch ``batch`` to publish now; records it as open when new."""
        mark = self._mark if self._mark is not None else await self._read()
        action = plan(mark, batch)
        if action is Action.SKIP:
            self.skipped += 1
            return []
        if action is Action.RESUME:
            assert mark is not None
            self.resumed += 1
            return missing(out, await self._stored_ids(mark.start_seq, out))
        info = await self.js.stream_info(self.stream)
        start = int(info.state.last_seq) + 1
        await self._write(Mark(batch=batch, done=False, start_seq=start))
        return out

    async def after(self, batch: int, count: int) -> None:
        """Batch ``batch`` is published in full (every message acknowledged)."""
        mark = self._mark
        start = mark.start_seq if mark is not None and mark.batch == batch else 0
        await self._write(Mark(batch=batch, done=True, start_seq=start, count=count))

    async def _write(self, mark: Mark) -> None:
        await self.kv.put(self.key, mark.model_dump_json().encode())
        self._mark = mark

    async def _read(self) -> Mark | None:
        try:
            entry = await self.kv.get(self.key)
        except KeyNotFoundError:
            return None
        try:
            self._mark = Mark.model_validate_json(entry.value or b"")
        except ValidationError:
            return None  # unreadable: publish whole (the duplicate window still helps)
        return self._mark

    async def _stored_ids(self, start_seq: int, out: Encoded) -> set[str]:
        """Ids among ``out``'s that the stream holds from ``start_seq`` on (read with
        headers only, the sink's subjects; a pull that times out: nothing more)."""
        wanted = {m[2] for m in out}
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
