"""The control plane nobody else can write, tried as an attacker would on a real locked
nats-server: every way of making the *server* publish on a client's behalf — the reply
subject of a reading, of a JetStream API request, of a DIRECT.GET of a message the
attacker stored, a push consumer's deliver subject — aimed at the control log, the
leader lease and the snapshots, by a device, an agent and a reader, on the hub and
from a site across a leaf link, while the leader commits.

Each attack is also aimed at a decoy stream on the same subjects in the application
account: it lands there (so the attack ran and the server did publish for the
attacker), and never in the control account."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, RePublish, StreamConfig

from spanflow.control import records as r
from spanflow.control.log import ControlLog
from spanflow.control.state import ClusterState
from spanflow.errors import SecurityError
from spanflow.nats.cluster import LEADER_BUCKET, WAL_STREAM, ensure_kv
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.protocol.names import SNAPSHOTS_BUCKET
from spanflow.security.secrets import NatsIdentity, Secrets
from spanflow.spec.topology import Site

CONTROL_TARGETS = (
    "spanflow.wal.site",
    f"$KV.{LEADER_BUCKET}.leader",
    f"$O.{SNAPSHOTS_BUCKET}.M.c3RhdGU=",
)
"""Subjects that would change the control plane if a message landed on them: a log
record, the leader lease, the snapshot's metadata."""
DECOY = "DECOY_WAL"


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Secrets:
    found = Secrets(tmp_path_factory.mktemp("control") / "secrets")
    found.init()
    found.add_device("press-7", ("sensors.press-7.>",))
    return found


@pytest.fixture(scope="module")
def hub(secrets: Secrets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    directory = tmp_path_factory.mktemp("hub")
    with EmbeddedNats(directory, name="hub", domain="hub", leaf_listen=True, secrets=secrets) as s:
        yield s


async def _app_streams(url: str, secrets: Secrets) -> None:
    """What the application account holds: readings, an attacker-friendly stream an
    agent made, and the decoy on the control plane's subjects."""
    nc = await connect(url, identity=secrets.identity("coordinator"))
    js = nc.jetstream()
    names = {s.config.name for s in await js.streams_info()}
    if "READINGS" not in names:
        await js.add_stream(StreamConfig(name="READINGS", subjects=["sensors.>"]))
        await js.add_stream(
            StreamConfig(name=DECOY, subjects=["spanflow.wal.>", "$KV.spanflow_leader.>"])
        )
    await nc.close()


async def _attack_once(url: str, secrets: Secrets) -> None:
    """Every trick once, by a device, an agent and a reader."""
    device = await connect(url, identity=secrets.device_identity("press-7"))
    agent = await connect(url, identity=secrets.identity("agent"))
    reader = await connect(url, identity=secrets.identity("reader"))
    try:
        ajs = agent.jetstream()
        names = {s.config.name for s in await ajs.streams_info()}
        if "EVIL" not in names:
            await ajs.add_stream(StreamConfig(name="EVIL", subjects=["evil.>"], allow_direct=True))
        forged = r.SitePut(at=1.0, site=Site(name="forged"))
        stored = await ajs.publish("evil.record", r.encode(forged))
        for target in CONTROL_TARGETS:
            await device.publish("sensors.press-7.temp", b"21.5", reply=target)
            await reader.publish("$JS.API.STREAM.INFO.READINGS", b"", reply=target)
            get = json.dumps({"seq": stored.seq}).encode()
            await agent.publish("$JS.API.DIRECT.GET.EVIL", get, reply=target)
            await agent.publish("$JS.API.STREAM.MSG.GET.EVIL", get, reply=target)
        for nc in (device, agent, reader):
            await nc.flush()
    finally:
        for nc in (device, agent, reader):
            await nc.close()


async def _push_consumer_at(url: str, secrets: Secrets, deliver: str) -> None:
    agent = await connect(url, identity=secrets.identity("agent"))
    try:
        await agent.jetstream().add_consumer(
            "EVIL", ConsumerConfig(deliver_subject=deliver, inactive_threshold=30)
        )
    finally:
        await agent.close()


async def _republish_and_purge(url: str, secrets: Secrets) -> None:
    """An agent's stream that republishes what it stores onto the log's subjects, and
    an agent purging or deleting the control streams by name."""
    agent = await connect(url, identity=secrets.identity("agent"))
    try:
        ajs = agent.jetstream(timeout=2.0)
        await ajs.add_stream(
            StreamConfig(
                name="ECHO",
                subjects=["echo.>"],
                republish=RePublish(src="echo.>", dest="spanflow.wal.>"),
            )
        )
        await ajs.publish("echo.site", b'{"kind": "site"}')
        for stream in (WAL_STREAM, f"OBJ_{SNAPSHOTS_BUCKET}", f"KV_{LEADER_BUCKET}"):
            with pytest.raises(nats.errors.Error):  # not in its account: not found
                await ajs.purge_stream(stream)
            with pytest.raises(nats.errors.Error):
                await ajs.delete_stream(stream)
    finally:
        await agent.close()


async def _messages(nc: Client, stream: str) -> int:
    return int((await nc.jetstream().stream_info(stream)).state.messages)


def test_no_application_identity_can_make_the_server_write_the_control_plane(
    hub: EmbeddedNats, secrets: Secrets
) -> None:
    async def scenario() -> None:
        await _app_streams(hub.url, secrets)
        control = await connect(hub.url, identity=secrets.identity("control"))
        data = await connect(hub.url, identity=secrets.identity("coordinator"))
        leader = await ControlLog.open(control, data_nc=data)
        leases = await ensure_kv(control.jetstream(), LEADER_BUCKET, ttl=30)
        await leases.put("leader", b'{"holder": "c1"}')
        state = ClusterState()
        before = await _messages(control, WAL_STREAM)
        decoy_before = await _messages(data, DECOY)

        stop = asyncio.Event()

        async def attacker() -> int:
            rounds = 0
            while not stop.is_set():
                await _attack_once(hub.url, secrets)
                rounds += 1
            return rounds

        await _attack_once(hub.url, secrets)  # makes the agent's EVIL stream
        await _republish_and_purge(hub.url, secrets)
        attacking = asyncio.create_task(attacker())
        await _push_consumer_at(hub.url, secrets, "spanflow.wal.pushed")
        committed = 0
        for n in range(20):  # the leader writes all along; none may be refused
            await leader.commit(state, [r.SitePut(at=float(n), site=Site(name=f"s{n}"))])
            committed += 1
        stop.set()
        rounds = await attacking
        assert rounds >= 1

        # The attacks ran: the server published them in the application account ...
        assert await _messages(data, DECOY) >= decoy_before + 3 * rounds
        # ... and not one reached the control account.
        assert await _messages(control, WAL_STREAM) == before + committed
        assert (await leases.get("leader")).value == b'{"holder": "c1"}'
        recovered, _ = await (await ControlLog.open(control, data_nc=data)).recover()
        assert {site.name for site in recovered.topology.sites} == {f"s{n}" for n in range(20)}
        await control.close()
        await data.close()

    asyncio.run(scenario())


def test_a_site_across_a_leaf_link_cannot_reach_the_hub_control_plane(
    hub: EmbeddedNats, secrets: Secrets, tmp_path: Path
) -> None:
    site = EmbeddedNats(
        tmp_path / "site",
        name="factory",
        domain="factory",
        leaf_remote=hub.leaf_url,
        secrets=secrets,
    )
    with site:

        async def scenario() -> None:
            await _app_streams(hub.url, secrets)
            await _app_streams(site.url, secrets)  # the site's own readings (and decoy)
            control = await connect(hub.url, identity=secrets.identity("control"))
            data = await connect(hub.url, identity=secrets.identity("coordinator"))
            await ControlLog.open(control, data_nc=data)
            before = await _messages(control, WAL_STREAM)
            decoy_before = await _messages(data, DECOY)
            # A reading stored at the site, its ack aimed at the control log: the site's
            # server publishes the ack, the leaf link carries it to the hub's application
            # account (the decoy there stores it) and no further.
            device = await connect(site.url, identity=secrets.device_identity("press-7"))
            agent = await connect(site.url, identity=secrets.identity("agent"))
            deadline = asyncio.get_running_loop().time() + 20
            while await _messages(data, DECOY) == decoy_before:
                assert asyncio.get_running_loop().time() < deadline, "no leaf link"
                for target in CONTROL_TARGETS:
                    await device.publish("sensors.press-7.temp", b"20.0", reply=target)
                    await agent.publish("$JS.hub.API.STREAM.INFO.DECOY", b"", reply=target)
                await device.flush()
                await agent.flush()
                await asyncio.sleep(0.2)
            await device.close()
            await agent.close()
            await _attack_once(site.url, secrets)  # every trick from the site, too
            await asyncio.sleep(0.5)  # nothing to poll for: give strays time to land
            assert await _messages(control, WAL_STREAM) == before
            await control.close()
            await data.close()

        asyncio.run(scenario())


def test_the_control_account_admits_the_control_user_only(
    hub: EmbeddedNats, secrets: Secrets
) -> None:
    control = secrets.identity("control")

    async def scenario() -> None:
        for role in ("coordinator", "agent", "reader"):  # another role's password
            other = secrets.identity(role)
            impostor = NatsIdentity(
                "control", other.password, control.ca_file, control.cert_file, control.key_file
            )
            with pytest.raises(SecurityError):
                await connect(hub.url, identity=impostor)
        for role in ("leaf", "route"):  # link users have no client rights at all
            link = secrets.identity(role)
            with pytest.raises(SecurityError):
                await connect(hub.url, identity=link)

    asyncio.run(scenario())


def test_devices_and_readers_read_their_own_replies_and_delete_no_consumer(
    hub: EmbeddedNats, secrets: Secrets
) -> None:
    async def scenario() -> None:
        await _app_streams(hub.url, secrets)
        coordinator = await connect(hub.url, identity=secrets.identity("coordinator"))
        cjs = coordinator.jetstream()
        await cjs.add_consumer("READINGS", ConsumerConfig(durable_name="agents-own"))
        device = await connect(hub.url, identity=secrets.device_identity("press-7"))
        reader = await connect(hub.url, identity=secrets.identity("reader"))
        snooped: list[str] = []

        async def keep(msg: object) -> None:
            snooped.append(getattr(msg, "subject", "?"))

        for nc in (device, reader):
            for pattern in ("_INBOX.>", "_INBOX_DEV.>", ">"):
                await nc.subscribe(pattern, cb=keep)
            await nc.flush()
        # the coordinator's replies (stream info, KV answers) pass by: nobody else sees them
        for _ in range(5):
            await cjs.stream_info("READINGS")
        # each still gets its own replies: a stored reading, a reader's consumer
        ack = await device.jetstream().publish("sensors.press-7.temp", b"19.5")
        assert ack.stream == "READINGS"
        sub = await reader.jetstream().subscribe("sensors.>", ordered_consumer=True)
        assert (await sub.next_msg(timeout=5)).subject.startswith("sensors.")
        await sub.unsubscribe()
        with pytest.raises(nats.errors.Error):  # someone else's consumer stays
            await reader.jetstream(timeout=1.0).delete_consumer("READINGS", "agents-own")
        assert (await cjs.consumer_info("READINGS", "agents-own")).name == "agents-own"
        assert not [s for s in snooped if s.startswith("_INBOX.")], snooped
        for nc in (device, reader, coordinator):
            await nc.close()

    asyncio.run(scenario())
