"""A certificate logs in as the user it names, and as nobody else: locked servers map a
client certificate to its user (``verify_and_map``) and check the password against
that user, so a stolen device host's certificate cannot be paired with another role's
password; a certificate the CA issued for no user is refused; the server's MQTT
listener admits devices only; a revoked device's own certificate is refused by the
server. And an agent — a certificate for every node of the fleet — cannot write the
control state's copy the coordinators project (nodes, pipelines, assignments)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import StreamConfig

from spanflow.nats.cluster import ensure_kv
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect, ensure_stream
from spanflow.protocol.names import ASSIGNMENTS_BUCKET, NODES_BUCKET
from spanflow.security import pki
from spanflow.security.secrets import Secrets, cert_user


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Secrets:
    found = Secrets(tmp_path_factory.mktemp("mapped") / "secrets")
    found.init()
    found.add_device("press-7", ("plant.press-7.>",))
    found.add_device("press-8", ("plant.press-8.>",))
    return found


@pytest.fixture(scope="module")
def server(secrets: Secrets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path_factory.mktemp("nats"), secrets=secrets, mqtt=True) as locked:
        yield locked


def _tls(secrets: Secrets, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(secrets.ca_cert))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


async def _login(url: str, tls: ssl.SSLContext, user: str, password: str) -> nats.NATS | None:
    """A client spanflow does not configure: raw nats-py with any name and password."""
    try:
        return await nats.connect(
            url, tls=tls, user=user, password=password, allow_reconnect=False,
            connect_timeout=3, max_reconnect_attempts=0,
        )  # fmt: skip
    except (nats.errors.Error, OSError):
        return None


def test_a_certificate_logs_in_as_the_user_it_names_and_no_other(
    secrets: Secrets, server: EmbeddedNats, tmp_path: Path
) -> None:
    creds = secrets.credentials()
    press7 = _tls(secrets, secrets.device_cert("press-7"), secrets.device_key("press-7"))
    agent = _tls(secrets, secrets.client_cert("agent"), secrets.client_key("agent"))
    ca = pki.Issued(secrets.ca_cert.read_bytes(), secrets.ca_key.read_bytes())
    stranger = pki.issue(ca, "intruder", client=True)  # the CA's, but for no user
    (tmp_path / "s.crt").write_bytes(stranger.cert_pem)
    (tmp_path / "s.key").write_bytes(stranger.key_pem)
    intruder = _tls(secrets, tmp_path / "s.crt", tmp_path / "s.key")
    as_server = _tls(secrets, secrets.server_cert, secrets.server_key)

    async def scenario() -> None:
        refused = [
            ("device certificate, agent's name and password", press7, "agent",
             creds.passwords["agent"]),
            ("device certificate, the agent's password", press7, "", creds.passwords["agent"]),
            ("device certificate, another device's password", press7, "press-8",
             creds.devices["press-8"].password),
            ("agent certificate, a device's password", agent, "press-7",
             creds.devices["press-7"].password),
            ("a certificate for no user", intruder, "coordinator",
             creds.passwords["coordinator"]),
            ("the server's certificate", as_server, "coordinator",
             creds.passwords["coordinator"]),
        ]  # fmt: skip
        for what, tls, user, password in refused:
            nc = await _login(server.url, tls, user, password)
            assert nc is None, f"admitted: {what}"
        own = creds.devices["press-7"].password
        coordinator = await connect(server.url, identity=secrets.identity("coordinator"))
        js = coordinator.jetstream()
        await js.add_stream(StreamConfig(name="PLANT", subjects=["plant.>"]))
        # whatever name its client sends, the device's certificate logs in as press-7
        for name in ("press-7", "agent", cert_user("agent")):
            device = await _login(server.url, press7, name, own)
            assert device is not None, name
            await device.publish("plant.press-8.temp", b"1")  # another device's subject
            await device.publish("plant.press-7.temp", b"2")
            await device.flush()
            await device.close()
        info = await js.stream_info("PLANT")
        assert info.state.messages == 3  # press-7's own readings only
        await coordinator.close()

    asyncio.run(scenario())


def _mqtt_connack(port: int, ca: Path, user: str, password: str) -> int:
    """The return code of a raw MQTT 3.1.1 CONNECT over TLS (0: accepted)."""

    def field(raw: bytes) -> bytes:
        return len(raw).to_bytes(2, "big") + raw

    body = field(b"MQTT") + bytes([4, 0xC2]) + (30).to_bytes(2, "big")
    body += field(b"probe") + field(user.encode()) + field(password.encode())
    ctx = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(bytes([0x10, len(body)]) + body)
        answer = tls.recv(4)
    assert answer[:2] == b"\x20\x02", answer
    return answer[3]


def test_the_servers_mqtt_listener_admits_devices_only(
    secrets: Secrets, server: EmbeddedNats
) -> None:
    creds = secrets.credentials()
    assert server.mqtt_port is not None
    port, ca = server.mqtt_port, secrets.ca_cert
    assert _mqtt_connack(port, ca, "press-7", creds.devices["press-7"].password) == 0
    assert _mqtt_connack(port, ca, "press-7", creds.devices["press-8"].password) != 0
    for role in ("agent", "coordinator", "reader"):
        password = creds.passwords[role]
        assert _mqtt_connack(port, ca, role, password) != 0, role
        assert _mqtt_connack(port, ca, cert_user(role), password) != 0, role


def test_a_revoked_devices_own_certificate_is_refused_by_the_server(
    secrets: Secrets, tmp_path: Path
) -> None:
    secrets.add_device("press-9", ("plant.press-9.>",))
    kept = tmp_path / "kept"  # what a stolen host still holds after the revoke
    kept.mkdir()
    shutil.copy(secrets.device_cert("press-9"), kept / "d.crt")
    shutil.copy(secrets.device_key("press-9"), kept / "d.key")
    password = secrets.credentials().devices["press-9"].password
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:

        async def scenario() -> None:
            tls = _tls(secrets, kept / "d.crt", kept / "d.key")
            before = await _login(server.url, tls, "", password)
            assert before is not None
            await before.close()
            secrets.revoke_device("press-9")
            assert not secrets.device_cert("press-9").exists()
            server.reload()
            assert await _login(server.url, tls, "", password) is None

        asyncio.run(scenario())


def test_an_agent_cannot_write_the_projected_control_state(
    secrets: Secrets, server: EmbeddedNats
) -> None:
    async def scenario() -> None:
        coordinator = await connect(server.url, identity=secrets.identity("coordinator"))
        cjs = coordinator.jetstream()
        assignments = await ensure_kv(cjs, ASSIGNMENTS_BUCKET)
        nodes = await ensure_kv(cjs, NODES_BUCKET)
        await assignments.put("n2.p-f1", b"signed by the coordinators")
        await nodes.put("n2", b"{}")
        await ensure_stream(cjs, "SENSORS", ["sensors.>"])  # devices' readings
        await cjs.publish("sensors.press-7", b"21.5")
        agent = await connect(server.url, identity=secrets.identity("agent"))
        ajs = agent.jetstream(timeout=1.0)
        theirs = await ajs.key_value(ASSIGNMENTS_BUCKET)  # it may read them ...
        assert (await theirs.get("n2.p-f1")).value == b"signed by the coordinators"
        attempts = [
            theirs.put("n2.p-f1", b"mine"),
            theirs.delete("n2.p-f1"),
            theirs.purge("n2.p-f1"),
            ajs.purge_stream(f"KV_{ASSIGNMENTS_BUCKET}"),
            ajs.delete_stream(f"KV_{NODES_BUCKET}"),
            (await ajs.key_value(NODES_BUCKET)).put("n2", b"forged"),
            ajs.delete_stream("SENSORS"),  # no agent deletes any stream,
            ajs.delete_msg("SENSORS", 1),  # nor a message of one,
            ajs.purge_stream("SENSORS"),  # nor purges the devices' readings
        ]
        for attempt in attempts:  # ... and write none of them
            with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
                await attempt
        assert (await assignments.get("n2.p-f1")).value == b"signed by the coordinators"
        assert (await nodes.get("n2")).value == b"{}"
        assert (await cjs.stream_info("SENSORS")).state.messages == 1
        for nc in (agent, coordinator):
            await nc.close()

    asyncio.run(scenario())
