"""Replies are their requester's alone. Agents share one NATS user, but a coordinator's
replies (stream info, KV acks — what it projects for the nodes), a reader's and a
device's come back on inbox prefixes of their own, which an agent's bundle can neither
subscribe to (not even through ``>``) nor publish on: it can read none of them and
answer none in the requester's place. The coordinator's own requests still get their
answers (so the inboxes the attack aims at are the ones in use)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.msg import Msg

from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.security.secrets import COORDINATOR_INBOX, Secrets


def test_an_agent_reads_and_answers_no_coordinators_reader_or_device_reply(
    tmp_path: Path,
) -> None:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    secrets.add_device("press-7", ("sensors.press-7.>",))
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:
        asyncio.run(_scenario(server.url, secrets))


async def _scenario(url: str, secrets: Secrets) -> None:
    coordinator = await connect(url, identity=secrets.identity("coordinator"))
    reader = await connect(url, identity=secrets.identity("reader"))
    agent = await connect(url, identity=secrets.identity("agent"))
    assert coordinator._inbox_prefix.decode() == COORDINATOR_INBOX
    seen: list[str] = []

    async def spy(msg: Msg) -> None:
        seen.append(msg.subject)

    for subject in (">", f"{COORDINATOR_INBOX}.>", "_INBOX_READER.>", "_INBOX_DEV.>"):
        await agent.subscribe(subject, cb=spy)
    await agent.flush()
    js = coordinator.jetstream()
    await js.add_stream(name="PLANT", subjects=["plant.>"])
    await js.publish("plant.a", b"1")  # acked on the coordinator's inbox
    assert (await js.stream_info("PLANT")).state.messages == 1
    assert (await reader.jetstream().stream_info("PLANT")).state.messages == 1
    await asyncio.sleep(0.3)  # deliveries to the spy would be in by now
    replies = [s for s in seen if s.startswith(("_INBOX_", COORDINATOR_INBOX))]
    assert replies == [], replies
    assert "plant.a" in seen  # the spy does hear what agents may read

    answered: list[bytes] = []

    async def mine(msg: Msg) -> None:
        answered.append(msg.data)

    await coordinator.subscribe(f"{COORDINATOR_INBOX}.pending.*", cb=mine)
    await reader.subscribe("_INBOX_READER.pending.*", cb=mine)
    await coordinator.flush()
    await reader.flush()
    for inbox in (f"{COORDINATOR_INBOX}.pending.1", "_INBOX_READER.pending.1"):
        await agent.publish(inbox, b"forged")
    await agent.flush()
    await coordinator.publish(f"{COORDINATOR_INBOX}.pending.2", b"genuine")
    await coordinator.flush()
    deadline = asyncio.get_running_loop().time() + 5
    while not answered:
        assert asyncio.get_running_loop().time() < deadline, "the genuine answer never came"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert answered == [b"genuine"]
    for nc in (coordinator, reader, agent):
        await nc.close()
