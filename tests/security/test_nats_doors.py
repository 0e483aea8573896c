"""Every NATS door of a locked server, against the real nats-server: the right identity
gets in; no credentials, a wrong password, another CA's certificate, an expired one are
refused at once with the cause; a device publishes its own readings and nothing else;
an agent cannot rewrite the control log. Nothing else is disturbed."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import StreamConfig

from spanflow.errors import SecurityError
from spanflow.nats.cluster import WAL_STREAM
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.security import pki
from spanflow.security.secrets import NatsIdentity, Secrets


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Secrets:
    found = Secrets(tmp_path_factory.mktemp("locked") / "secrets")
    found.init()
    found.add_device("press-7", ("sensors.press-7.>",))
    return found


@pytest.fixture(scope="module")
def server(secrets: Secrets) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(secrets=secrets) as locked:
        yield locked


async def _setup_streams(url: str, secrets: Secrets) -> None:
    nc = await connect(url, identity=secrets.identity("coordinator"))
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="READINGS", subjects=["sensors.>"]))
    await js.add_stream(StreamConfig(name=WAL_STREAM, subjects=["spanflow.wal.>"]))
    await js.publish("spanflow.wal.1", b"placement")
    await nc.close()


async def _count(url: str, secrets: Secrets, stream: str) -> int:
    nc = await connect(url, identity=secrets.identity("reader"))
    try:
        return int((await nc.jetstream().stream_info(stream)).state.messages)
    finally:
        await nc.close()


async def _refused(url: str, identity: NatsIdentity | None) -> str:
    start = time.monotonic()
    with pytest.raises(SecurityError) as caught:
        await connect(url, identity=identity)
    assert time.monotonic() - start < 4.0, "a refusal must fail fast, not retry"
    return str(caught.value)


def test_each_door_refuses_the_wrong_client_and_admits_the_right_one(
    server: EmbeddedNats, secrets: Secrets, tmp_path: Path
) -> None:
    assert server.url.startswith("tls://")
    other = Secrets(tmp_path / "other")
    other.init()
    good = secrets.identity("agent")

    async def scenario() -> None:
        await _setup_streams(server.url, secrets)
        agent = await connect(server.url, identity=good)  # stays connected throughout
        message = await _refused(server.url, None)
        assert "without credentials" in message and "not trusted" in message
        wrong = NatsIdentity("agent", "guess", good.ca_file, good.cert_file, good.key_file)
        message = await _refused(server.url, wrong)
        assert "user 'agent'" in message and "wrong user or password" in message
        assert "guess" not in message and good.password not in message
        no_user = NatsIdentity("", "", good.ca_file, good.cert_file, good.key_file)
        assert "Authorization Violation" in await _refused(server.url, no_user)
        assert "not trusted" in await _refused(server.url, other.identity("agent"))
        foreign = other.identity("agent")
        stranger = NatsIdentity(
            "agent", good.password, good.ca_file, foreign.cert_file, foreign.key_file
        )
        assert "refused our client certificate" in await _refused(server.url, stranger)
        # the agent that was in all along still works
        ack = await agent.jetstream().publish("sensors.press-1.temp", b"21.5")
        assert ack.stream == "READINGS"
        await agent.close()

    asyncio.run(scenario())


def test_an_expired_client_certificate_is_refused(
    server: EmbeddedNats, secrets: Secrets, tmp_path: Path
) -> None:
    ca = pki.Issued(secrets.ca_cert.read_bytes(), secrets.ca_key.read_bytes())
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    old = pki.issue(ca, "agent", client=True, days=1, not_before=long_ago)
    (tmp_path / "old.crt").write_bytes(old.cert_pem)
    (tmp_path / "old.key").write_bytes(old.key_pem)
    good = secrets.identity("agent")
    expired = NatsIdentity(
        "agent", good.password, good.ca_file, tmp_path / "old.crt", tmp_path / "old.key"
    )
    message = asyncio.run(_refused(server.url, expired))
    assert "certificate expired" in message


def test_a_device_publishes_its_own_readings_and_nothing_else(
    server: EmbeddedNats, secrets: Secrets
) -> None:
    async def scenario() -> None:
        await _setup_streams_once(server.url, secrets)
        before = await _count(server.url, secrets, "READINGS")
        wal_before = await _count(server.url, secrets, WAL_STREAM)
        device = await connect(server.url, identity=secrets.device_identity("press-7"))
        js = device.jetstream(timeout=1.0)
        await js.publish("sensors.press-7.temp", b"20.1")
        for subject in ("sensors.press-8.temp", "spanflow.wal.9"):
            with pytest.raises(nats.errors.Error):  # no ack: the server dropped it
                await js.publish(subject, b"forged")
        await device.close()
        assert await _count(server.url, secrets, "READINGS") == before + 1
        assert await _count(server.url, secrets, WAL_STREAM) == wal_before

    asyncio.run(scenario())


def test_an_agent_cannot_rewrite_the_control_log_and_a_reader_cannot_write(
    server: EmbeddedNats, secrets: Secrets
) -> None:
    async def scenario() -> None:
        await _setup_streams_once(server.url, secrets)
        wal_before = await _count(server.url, secrets, WAL_STREAM)
        agent = await connect(server.url, identity=secrets.identity("agent"))
        js = agent.jetstream(timeout=1.0)
        with pytest.raises(nats.errors.Error):
            await js.publish("spanflow.wal.2", b"forged placement")
        with pytest.raises(nats.errors.Error):
            await js.purge_stream(WAL_STREAM)
        with pytest.raises(nats.errors.Error):
            await js.delete_stream(WAL_STREAM)
        info = await js.stream_info(WAL_STREAM)  # reading it is allowed
        assert info.state.messages == wal_before
        await js.publish("sensors.press-1.temp", b"22.0")  # its own work goes on
        await agent.close()
        reader = await connect(server.url, identity=secrets.identity("reader"))
        rjs = reader.jetstream(timeout=1.0)
        with pytest.raises(nats.errors.Error):
            await rjs.publish("sensors.press-1.temp", b"from a dashboard")
        sub = await rjs.subscribe("sensors.>", ordered_consumer=True)
        first = await sub.next_msg(timeout=5)
        assert first.subject.startswith("sensors.")
        await reader.close()

    asyncio.run(scenario())


def test_a_device_added_later_gets_in_after_a_reload(
    server: EmbeddedNats, secrets: Secrets
) -> None:
    secrets.add_device("press-9", ("sensors.press-9.>",))
    identity = secrets.device_identity("press-9")

    async def attempt() -> bool:
        try:
            nc = await connect(server.url, identity=identity)
        except SecurityError:
            return False
        await nc.close()
        return True

    assert not asyncio.run(attempt())
    server.reload()
    deadline = time.monotonic() + 10
    while not asyncio.run(attempt()):
        assert time.monotonic() < deadline, "the reloaded server never admitted press-9"
        time.sleep(0.1)


_ready: set[str] = set()


async def _setup_streams_once(url: str, secrets: Secrets) -> None:
    if url not in _ready:
        nc = await connect(url, identity=secrets.identity("coordinator"))
        names = [s.config.name for s in await nc.jetstream().streams_info()]
        await nc.close()
        if "READINGS" not in names:
            await _setup_streams(url, secrets)
        _ready.add(url)
