"""Publish rejected input to the dead-letter stream, idempotently.

Each dead letter keeps the original bytes as its payload and says why in headers
(``Spanflow-Reason``, ``-Pipeline``, ``-Step``, ``-Stream``, ``-Subject``, ``-Seq``,
``-Time``), and carries the epoch of the fragment that wrote it (``Spanflow-Epoch``,
as sink records do) when it runs under a fence. Its ``Nats-Msg-Id`` is derived from
where the record came from, so a replayed micro-batch does not dead-letter the same
message twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nats.aio.client import Client

from spanflow.nats.fences import EPOCH_HEADER
from spanflow.nats.streams import connect
from spanflow.protocol.names import DLQ_SUBJECT_PREFIX as DLQ_SUBJECT_PREFIX

EPOCH_PROPERTY = "spanflow.epoch"
"""Spark local property the runner sets to its fence's epoch before it starts a query:
every task of the query (a source reader, a keyed processor, a UDF) sees it."""


def task_epoch() -> int | None:
    """The epoch of the fragment whose Spark task runs this code (None: none, or not
    in a task)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    ctx = TaskContext.get()
    value = ctx.getLocalProperty(EPOCH_PROPERTY) if ctx is not None else None
    return int(value) if value and value.isdigit() else None


LATE = "late"
"""The kind of dead letter a late record is: its subject ends ``.<step>.late``, its
reason starts ``late:``."""


def dlq_subject(pipeline: str, step: str, kind: str = "") -> str:
    """``spanflow.dlq.<pipeline>.<step>``, and ``.<kind>`` for a kind (late records)."""
    return f"{DLQ_SUBJECT_PREFIX}.{pipeline}.{step}" + (f".{kind}" if kind else "")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    msg_id: str
    data: bytes
    reason: str
    stream: str = ""
    subject: str = ""
    seq: int = 0


async def publish_dead_letters(
    nc: Client,
    pipeline: str,
    step: str,
    letters: Sequence[DeadLetter],
    timeout: float = 30.0,
    epoch: int | None = None,
    kind: str = "",
) -> None:
    """Publish ``letters`` (``epoch``: the writer's, else the running task's; ``kind``:
    their subject's last token, as :data:`LATE`)."""
    if not letters:
        return
    epoch = epoch if epoch is not None else task_epoch()
    extra = {EPOCH_HEADER: str(epoch)} if epoch is not None else {}
    js = nc.jetstream()
    subject = dlq_subject(pipeline, step, kind)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    futures = []
    for letter in letters:
        headers = {
            "Nats-Msg-Id": letter.msg_id,
            "Spanflow-Reason": letter.reason.replace("\r", " ").replace("\n", " ")[:1000],
            "Spanflow-Pipeline": pipeline,
            "Spanflow-Step": step,
            "Spanflow-Stream": letter.stream,
            "Spanflow-Subject": letter.subject,
            "Spanflow-Seq": str(letter.seq),
            "Spanflow-Time": now,
            **extra,
        }
        futures.append(await js.publish_async(subject, letter.data, headers=headers))
    await asyncio.wait_for(asyncio.gather(*futures), timeout)


def send_dead_letters(
    url: str,
    pipeline: str,
    step: str,
    letters: Sequence[DeadLetter],
    epoch: int | None = None,
    kind: str = "",
) -> None:
    """Publish dead letters over a connection of their own (from a Spark worker)."""
    if not letters:
        return
    epoch = epoch if epoch is not None else task_epoch()

    async def go() -> None:
        nc = await connect(url)
        try:
            await publish_dead_letters(nc, pipeline, step, letters, epoch=epoch, kind=kind)
        finally:
            await nc.close()

    asyncio.run(go())
