"""Fences: one writer per fragment, the one with the newest epoch.

Every assignment of a fragment has an epoch that grows with each (re)assignment. A
node starting a fragment *claims* its fence — a key per fragment in the
``spanflow_fences`` bucket of the server its sinks write to — with its epoch, and
every batch *checks* it before publishing: a node whose fragment was moved while it
was cut off finds a newer epoch there and stops before it writes (and so before Spark
commits the batch to the shared checkpoint). An old writer can never reclaim a fence
a newer epoch holds: claims are compare-and-set on the key's revision.

The check and the publish are two steps, so a writer that passed its check just
before the new owner claimed may still write that one batch; both then publish the
same batch from the same checkpoint with the same message ids, and JetStream keeps
one copy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from spanflow.errors import SpanflowError
from spanflow.nats.cluster import ensure_kv
from spanflow.protocol.names import FENCES_BUCKET as FENCES_BUCKET

EPOCH_HEADER = "Spanflow-Epoch"
"""Carried by every message a fragment's sink publishes: which epoch wrote it."""


@dataclass(frozen=True)
class Fence:
    """Who a runner writes as: its fragment, the assignment's epoch, its node, and the
    checkpoint it commits to (a resubmitted pipeline has a new one, and epochs that
    start again from 1)."""

    fragment_id: str
    epoch: int
    node: str
    checkpoint: str

    @property
    def key(self) -> str:
        digest = hashlib.blake2b(self.checkpoint.encode(), digest_size=6).hexdigest()
        return f"{self.fragment_id}.{digest}"


class Fenced(SpanflowError):
    """A newer epoch of this fragment runs elsewhere: this one must not write."""

    code = "fenced"


async def fences(js: JetStreamContext, replicas: int | None = None) -> KeyValue:
    """The fences bucket, with as many copies as the streams it guards."""
    return await ensure_kv(js, FENCES_BUCKET, replicas=replicas)


def _epoch_of(value: bytes | None) -> int:
    return int(orjson.loads(value)["epoch"]) if value else 0


async def claim(kv: KeyValue, fence: Fence) -> None:
    """Hold the fence at its epoch; raises :class:`Fenced` when a newer epoch holds it."""
    key, epoch = fence.key, fence.epoch
    value = orjson.dumps({"epoch": epoch, "node": fence.node})
    while True:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            try:
                await kv.create(key, value)
                return
            except KeyWrongLastSequenceError:
                continue  # someone claimed it meanwhile: look again
        held = _epoch_of(entry.value)
        if held > epoch:
            raise Fenced(
                f"fragment {fence.fragment_id}: epoch {held} runs elsewhere; this is {epoch}"
            )
        if held == epoch:
            return
        try:
            await kv.update(key, value, last=entry.revision)
            return
        except KeyWrongLastSequenceError:
            continue


async def check(kv: KeyValue, fence: Fence) -> None:
    """Raise :class:`Fenced` unless the fence's epoch still holds it."""
    try:
        entry = await kv.get(fence.key)
    except KeyNotFoundError:
        raise Fenced(f"fragment {fence.fragment_id}: its fence is gone") from None
    held = _epoch_of(entry.value)
    if held != fence.epoch:
        raise Fenced(
            f"fragment {fence.fragment_id}: epoch {held} holds its fence; this is {fence.epoch}"
        )
