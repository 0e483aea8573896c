"""Fences: one writer per fragment, the one with the newest epoch.

Every assignment of a fragment has an epoch that grows with each (re)assignment. A
node starting a fragment *claims* its fence — a key per fragment in the
``spanflow_fences`` bucket of the server its sinks write to — with its epoch, and
every batch *checks* it before publishing: a node whose fragment was moved while it
was cut off finds a newer epoch there and stops before it writes (and so before Spark
commits the batch to the shared checkpoint). An old writer can never reclaim a fence
a newer epoch holds: claims are compare-and-set on the key's revision.

Locked, a fence value carries its proof: the assignment the coordinators signed for
that fragment, epoch and checkpoint (the bytes the node found in its assignments
bucket). Agents share one NATS identity and can put any key of the bucket, so a value
without a proof that verifies — a forged "newer epoch" from another node's host, or a
genuine old one replayed — does not stop the writer: it claims its fence back (and
logs it). Only a newer assignment the coordinators signed fences it.

The check and the publish are two steps, so a writer that passed its check just
before the new owner claimed may still write that one batch; both then publish the
same batch from the same checkpoint with the same message ids, and JetStream keeps
one copy.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import orjson
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from spanflow.errors import SpanflowError
from spanflow.nats.cluster import ensure_kv
from spanflow.protocol.names import FENCES_BUCKET as FENCES_BUCKET
from spanflow.security.signing import Unsigned, Verifier, read_signed
from spanflow.spec.cluster import Assignment

log = logging.getLogger(__name__)

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
    proof: bytes | None = None
    """Locked: the signed assignment this epoch runs (its assignments bucket value)."""

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


def value_of(fence: Fence) -> bytes:
    """What a fence key holds for ``fence``: its epoch, node and (locked) proof."""
    raw: dict[str, object] = {"epoch": fence.epoch, "node": fence.node}
    if fence.proof is not None:
        raw["proof"] = fence.proof.decode()
    return orjson.dumps(raw)


def held_epoch(value: bytes | None, fence: Fence, verifier: Verifier | None) -> int | None:
    """The epoch a fence value holds (0: none); None when, locked (``verifier``), its
    proof is not an assignment the coordinators signed for this fragment and
    checkpoint at that epoch."""
    if not value:
        return 0
    try:
        raw = orjson.loads(value)
        epoch = int(raw["epoch"])
    except (ValueError, KeyError, TypeError):  # not a fence value at all
        return None if verifier is not None else 0
    if verifier is None:
        return epoch
    try:
        signed = read_signed(str(raw.get("proof")).encode(), verifier)
        a = Assignment.model_validate_json(signed)
    except (Unsigned, ValueError):
        return None
    if (a.fragment.id, a.epoch, a.checkpoint_dir) != (fence.fragment_id, epoch, fence.checkpoint):
        return None
    return epoch


async def claim(kv: KeyValue, fence: Fence, verifier: Verifier | None = None) -> None:
    """Hold the fence at its epoch; raises :class:`Fenced` when a newer epoch holds it
    (locked: one the coordinators signed; a forged value is claimed over)."""
    key, epoch = fence.key, fence.epoch
    value = value_of(fence)
    while True:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            try:
                await kv.create(key, value)
                return
            except KeyWrongLastSequenceError:
                continue  # someone claimed it meanwhile: look again
        held = held_epoch(entry.value, fence, verifier)
        if held is None:
            log.warning("fence of %s held a value no coordinator signed: claimed over it",
                        fence.fragment_id)  # fmt: skip
            held = 0
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


async def check(kv: KeyValue, fence: Fence, verifier: Verifier | None = None) -> None:
    """Raise :class:`Fenced` unless the fence's epoch still holds it. Locked, a value
    that is not a newer signed assignment (forged, or an older one put back) is claimed
    over instead: only the coordinators move a fragment on."""
    try:
        entry = await kv.get(fence.key)
    except KeyNotFoundError:
        raise Fenced(f"fragment {fence.fragment_id}: its fence is gone") from None
    held = held_epoch(entry.value, fence, verifier)
    if verifier is not None and (held is None or held < fence.epoch):
        await claim(kv, fence, verifier)
        return
    if held != fence.epoch:
        raise Fenced(
            f"fragment {fence.fragment_id}: epoch {held} holds its fence; this is {fence.epoch}"
        )
