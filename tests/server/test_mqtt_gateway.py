"""The MQTT gateway with real devices (paho-mqtt) and a real nats-server: a PUBACK means
stored — also when the stream is full, where nats-server's own listener acknowledged
100 readings and stored 12 — resends are stored once, commands reach subscribers, and
in locked mode a device logs in with its own password over TLS and may publish only on
its own subjects."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from spanflow.doors.mqtt_gateway import MqttGateway
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.protocol import mqtt
from spanflow.security.secrets import NatsIdentity, Secrets


class Loop:
    """An asyncio loop on a thread of its own, for the gateway under test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def loop() -> Iterator[Loop]:
    runner = Loop()
    yield runner
    runner.stop()


def _until(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


async def _stream(url: str, identity: NatsIdentity | None, **config: Any) -> None:
    nc = await connect(url, identity=identity)
    await nc.jetstream().add_stream(StreamConfig(**config))
    await nc.close()


async def _count(url: str, name: str, identity: NatsIdentity | None = None) -> int:
    nc = await connect(url, identity=identity)
    try:
        return int((await nc.jetstream().stream_info(name)).state.messages)
    finally:
        await nc.close()


def _device(port: int, client_id: str, **login: Any) -> tuple[paho.Client, list[int]]:
    acked: list[int] = []
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id)
    client.on_publish = lambda c, u, mid, rc, props: acked.append(mid)
    client.reconnect_delay_set(min_delay=1, max_delay=1)
    if login.get("username"):
        client.username_pw_set(login["username"], login.get("password"))
    if login.get("ca"):
        client.tls_set(ca_certs=str(login["ca"]))
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    return client, acked


def test_a_puback_means_stored_even_when_the_stream_is_full(tmp_path: Path, loop: Loop) -> None:
    with EmbeddedNats(tmp_path / "nats") as server:
        asyncio.run(
            _stream(
                server.url,
                None,
                name="FULL",
                subjects=["plant.>"],
                max_msgs=12,
                discard=DiscardPolicy.NEW,
            )
        )
        gateway = loop.run(MqttGateway(server.url).start())
        client, acked = _device(gateway.port, "press-1")
        try:
            infos = [
                client.publish("plant/press-1/temp", f"{i}".encode(), qos=1) for i in range(100)
            ]
            _until(lambda: gateway.stats.not_stored > 0, "the full stream never refused")
            time.sleep(0)  # acks already sent are counted below; none may exceed stored
            _until(lambda: len(acked) >= 12, "the stored readings were not acknowledged")
            stored = asyncio.run(_count(server.url, "FULL"))
            assert stored == 12 and len(set(acked)) == 12
            assert sum(i.is_published() for i in infos) == 12  # 88 kept by the device

            # Room again: the device resends what was not acknowledged, all of it stored once
            async def purge() -> None:
                nc = await connect(server.url)
                await nc.jetstream().update_stream(
                    StreamConfig(
                        name="FULL", subjects=["plant.>"], max_msgs=1000, discard=DiscardPolicy.NEW
                    )
                )
                await nc.close()

            asyncio.run(purge())
            _until(lambda: all(i.is_published() for i in infos), "resends never acknowledged", 60)
            stored = asyncio.run(_count(server.url, "FULL"))
            assert stored == 100
        finally:
            client.disconnect()
            client.loop_stop()
            loop.run(gateway.close())


def test_commands_reach_subscribed_devices_and_qos0_is_published(
    tmp_path: Path, loop: Loop
) -> None:
    with EmbeddedNats(tmp_path / "nats") as server:
        asyncio.run(_stream(server.url, None, name="READ", subjects=["plant.>"]))
        gateway = loop.run(MqttGateway(server.url).start())
        got: list[tuple[str, bytes]] = []
        client, _ = _device(gateway.port, "press-2")
        client.on_message = lambda c, u, m: got.append((m.topic, m.payload))
        client.subscribe("commands/press-2/#", qos=1)
        try:

            async def command() -> None:
                nc = await connect(server.url)
                await nc.publish("commands.press-2.set", b"rpm=900")
                await nc.flush()
                await nc.close()

            _until(lambda: gateway.stats.connections == 1, "no connection")
            deadline = time.monotonic() + 20
            while not got:  # until the subscription is in place
                assert time.monotonic() < deadline, "no command arrived"
                asyncio.run(command())
                time.sleep(0.2)
            assert got[0] == ("commands/press-2/set", b"rpm=900")
            client.publish("plant/press-2/temp", b"21", qos=0)
            _until(lambda: asyncio.run(_count(server.url, "READ")) == 1, "QoS 0 not published")
        finally:
            client.disconnect()
            client.loop_stop()
            loop.run(gateway.close())


def test_locked_gateway_logs_devices_in_and_keeps_them_to_their_subjects(
    tmp_path: Path, loop: Loop
) -> None:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    password = secrets.add_device("press-7", ("plant.press-7.>",))
    admin = secrets.identity("coordinator")
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:
        asyncio.run(_stream(server.url, admin, name="LOCKED", subjects=["plant.>"]))
        gateway = loop.run(MqttGateway(server.url, secrets=secrets).start())
        try:
            refused: list[Any] = []
            stranger = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="x")
            stranger.on_connect = lambda c, u, f, rc, p: refused.append(rc)
            stranger.username_pw_set("press-7", "guess")
            stranger.tls_set(ca_certs=str(secrets.ca_cert))
            stranger.connect("127.0.0.1", gateway.port)
            stranger.loop_start()
            _until(lambda: refused, "no CONNACK for a wrong password")
            stranger.loop_stop()
            assert refused[0].is_failure and gateway.stats.refused_logins == 1
            with pytest.raises(ssl.SSLError):  # a device that trusts another CA
                plain = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="y")
                plain.tls_set(ca_certs=str(Secrets(_other(tmp_path)).ca_cert))
                plain.connect("127.0.0.1", gateway.port)

            client, _ = _device(
                gateway.port, "press-7", username="press-7", password=password, ca=secrets.ca_cert
            )
            try:
                own = client.publish("plant/press-7/temp", b"20.5", qos=1)
                _until(own.is_published, "its own reading was not acknowledged")
                other = client.publish("plant/press-8/temp", b"forged", qos=1)
                _until(
                    lambda: gateway.stats.not_stored >= 1, "a forged reading was not refused", 30
                )
                assert not other.is_published()
                assert asyncio.run(_count(server.url, "LOCKED", admin)) == 1
            finally:
                client.disconnect()
                client.loop_stop()
        finally:
            loop.run(gateway.close())


def test_locked_commands_reach_their_device_and_other_subscriptions_fail_visibly(
    tmp_path: Path, loop: Loop
) -> None:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    password = secrets.add_device(
        "press-7", ("plant.press-7.>",), subscribe=("commands.press-7.>",)
    )
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:
        gateway = loop.run(MqttGateway(server.url, secrets=secrets).start())
        got: list[tuple[str, bytes]] = []
        granted: list[list[int]] = []
        client, _ = _device(
            gateway.port, "press-7", username="press-7", password=password, ca=secrets.ca_cert
        )
        client.on_message = lambda c, u, m: got.append((m.topic, m.payload))
        client.on_subscribe = lambda c, u, mid, codes, p: granted.append(
            [int(getattr(code, "value", code)) for code in codes]
        )
        try:
            _until(lambda: gateway.stats.connections == 1, "no connection")
            client.subscribe([("commands/press-7/#", 0), ("commands/press-8/#", 0)])
            _until(lambda: granted, "no SUBACK")
            assert granted[0] == [0, 0x80]  # its own commands granted, another's refused

            async def command(subject: str) -> None:
                nc = await connect(server.url, identity=secrets.identity("coordinator"))
                await nc.publish(subject, b"stop")
                await nc.flush()
                await nc.close()

            deadline = time.monotonic() + 20
            while not got:
                assert time.monotonic() < deadline, "no command arrived"
                asyncio.run(command("commands.press-7.stop"))
                asyncio.run(command("commands.press-8.stop"))
                time.sleep(0.2)
            assert {topic for topic, _ in got} == {"commands/press-7/stop"}
        finally:
            client.disconnect()
            client.loop_stop()
            loop.run(gateway.close())


def _login_answer(port: int, client_id: str, user: str, password: str, ca: Path) -> Any:
    """The CONNACK's reason code of one login."""
    answers: list[Any] = []
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id)
    client.on_connect = lambda c, u, f, rc, p: answers.append(rc)
    client.username_pw_set(user, password)
    client.tls_set(ca_certs=str(ca))
    client.connect("127.0.0.1", port)
    client.loop_start()
    _until(lambda: answers, "no CONNACK")
    client.loop_stop()
    client.disconnect()
    return answers[0]


def test_a_revoked_device_is_cut_off_and_a_guesser_is_throttled(tmp_path: Path, loop: Loop) -> None:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    password = secrets.add_device("press-7", ("plant.press-7.>",))
    neighbour = secrets.add_device("press-9", ("plant.press-9.>",))
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:
        asyncio.run(
            _stream(server.url, secrets.identity("coordinator"), name="P", subjects=["plant.>"])
        )
        gateway = loop.run(MqttGateway(server.url, secrets=secrets).start())
        try:
            client, _ = _device(
                gateway.port, "press-7", username="press-7", password=password, ca=secrets.ca_cert
            )
            dropped: list[Any] = []
            client.on_disconnect = lambda c, u, f, rc, p: dropped.append(rc)
            try:
                first = client.publish("plant/press-7/temp", b"20.5", qos=1)
                _until(first.is_published, "its reading was not acknowledged")
                secrets.revoke_device("press-7")
                server.reload()  # what `spanflow site-server` does on SIGHUP
                _until(lambda: dropped, "the revoked device's MQTT session stayed open")
                assert asyncio.run(_count(server.url, "P", secrets.identity("reader"))) == 1
            finally:
                client.loop_stop()
                client.disconnect()
            # press-9, at the same address, logged in before the guesser came
            ca = secrets.ca_cert
            assert not _login_answer(gateway.port, "p9", "press-9", neighbour, ca).is_failure
            # a guesser: refused ten times, then refused without a check
            for n in range(12):
                answer = _login_answer(gateway.port, f"g{n}", "press-8", f"guess-{n}", ca)
                assert answer.is_failure
            assert gateway.stats.refused_logins == 10 and gateway.stats.throttled_logins == 2
            # press-9 is not locked out with the guesser's address
            assert not _login_answer(gateway.port, "p9", "press-9", neighbour, ca).is_failure
            assert _login_answer(gateway.port, "g", "press-8", "guess-x", ca).is_failure
            assert gateway.stats.throttled_logins == 3
        finally:
            loop.run(gateway.close())


def _other(tmp_path: Path) -> Path:
    other = Secrets(tmp_path / "other")
    other.init()
    return other.root


def test_topics_and_filters_map_as_nats_maps_them() -> None:
    assert mqtt.topic_to_subject("a/b.c/d") == "a.b//c.d"
    assert mqtt.subject_to_topic("a.b//c.d") == "a/b.c/d"
    assert mqtt.filter_to_subject("a/+/d/#") == "a.*.d.>"
    for bad in ("", "a//b", "a/+/b", "a b"):
        with pytest.raises(mqtt.MqttError):
            mqtt.topic_to_subject(bad)
    with pytest.raises(mqtt.MqttError):
        mqtt.filter_to_subject("a/#/b")
    with pytest.raises(mqtt.MqttError, match="four bytes"):
        mqtt.remaining_length(bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]))
    packet = mqtt.parse(0x32, b"\x00\x03a/b\x00\x07hello")
    assert packet == mqtt.Publish("a/b", b"hello", 1, 7, False, False)
