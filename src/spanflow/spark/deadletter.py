"""Publish rejected input to the dead-letter stream, idempotently.

Each dead letter keeps the original bytes as its payload and says why in headers
(``Spanflow-Reason``, ``-Pipeline``, ``-Step``, ``-Stream``, ``-Subject``, ``-Seq``,
``-Time``). Its ``Nats-Msg-Id`` is derived from where the record came from, so a
replayed micro-batch does not dead-letter the same message twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nats.aio.client import Client

from spanflow.nats.streams import connect

DLQ_SUBJECT_PREFIX = "spanflow.dlq"


def dlq_subject(pipeline: str, step: str) -> str:
    return f"{DLQ_SUBJECT_PREFIX}.{pipeline}.{step}"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    msg_id: str
    data: bytes
    reason: str
    stream: str = ""
    subject: str = ""
    seq: int = 0


async def publish_dead_letters(
    nc: Client, pipeline: str, step: str, letters: Sequence[DeadLetter], timeout: float = 30.0
) -> None:
    if not letters:
        return
    js = nc.jetstream()
    subject = dlq_subject(pipeline, step)
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
        }
        futures.append(await js.publish_async(subject, letter.data, headers=headers))
    await asyncio.wait_for(asyncio.gather(*futures), timeout)


def send_dead_letters(url: str, pipeline: str, step: str, letters: Sequence[DeadLetter]) -> None:
    """Publish dead letters over a connection of their own (from a Spark worker)."""
    if not letters:
        return

    async def go() -> None:
        nc = await connect(url)
        try:
            await publish_dead_letters(nc, pipeline, step, letters)
        finally:
            await nc.close()

    asyncio.run(go())
