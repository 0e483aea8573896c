from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from spanflow.errors import NatsError
from spanflow.nats import EmbeddedNats
from spanflow.nats.server import split_listen
from spanflow.nats.streams import connect, ensure_stream


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_embedded_server_is_durable_and_stops_without_orphans(tmp_path):
    server = EmbeddedNats(tmp_path / "n", mqtt=True).start()
    pid = server.pid
    assert pid is not None and _alive(pid)
    conf = (tmp_path / "n" / "nats.conf").read_text()
    assert "sync_interval: always" in conf
    with socket.create_connection(("127.0.0.1", server.mqtt_port), timeout=5):
        pass

    async def roundtrip() -> int:
        nc = await connect(server.url)
        js = nc.jetstream()
        await ensure_stream(js, "T", ["t.>"])
        ack = await js.publish("t.a", b"x")
        await nc.close()
        return ack.seq

    assert asyncio.run(roundtrip()) == 1
    server.stop()
    server.stop()  # idempotent
    assert not _alive(pid)

    # Data survives a restart on the same directory.
    with EmbeddedNats(tmp_path / "n") as again:

        async def count() -> int:
            nc = await connect(again.url)
            info = await nc.jetstream().stream_info("T")
            await nc.close()
            return info.state.messages

        assert asyncio.run(count()) == 1


def test_start_failure_reports_the_server_log(tmp_path):
    bad = EmbeddedNats(tmp_path / "n", name="bad name with { brace")
    with pytest.raises(NatsError, match=r"exited at start-up|did not start"):
        bad.start(timeout=10)


def _mqtt_publish(port: int, topic: str, payload: bytes) -> None:
    """A minimal MQTT 3.1.1 client: CONNECT, wait for CONNACK, PUBLISH (QoS 0), DISCONNECT."""

    def packet(kind: int, body: bytes) -> bytes:
        length, encoded = len(body), b""
        while True:
            byte, length = length % 128, length // 128
            encoded += bytes([byte | (0x80 if length else 0)])
            if not length:
                return bytes([kind]) + encoded + body

    def text(s: str) -> bytes:
        return len(s.encode()).to_bytes(2, "big") + s.encode()

    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(packet(0x10, text("MQTT") + b"\x04\x02\x00\x3c" + text("spanflow-test")))
        assert sock.recv(4) == b"\x20\x02\x00\x00"  # CONNACK, accepted
        sock.sendall(packet(0x30, text(topic) + payload))
        sock.sendall(b"\xe0\x00")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("listen", ["loopback", "all-interfaces"])
def test_mqtt_publishes_land_in_a_jetstream_stream(tmp_path, listen):
    port = _free_port()
    given = {"loopback": None, "all-interfaces": f"0.0.0.0:{port}"}[listen]
    with EmbeddedNats(tmp_path / "n", mqtt=given is None, mqtt_listen=given) as server:
        if given:  # devices on the LAN reach it: the port and interfaces asked for
            assert (server.mqtt_host, server.mqtt_port) == ("0.0.0.0", port)
        else:
            assert server.mqtt_host == "127.0.0.1"

        async def make_stream() -> None:
            nc = await connect(server.url)
            await ensure_stream(nc.jetstream(), "SENSORS", ["sensors.>"])
            await nc.close()

        async def stored() -> list[tuple[str, bytes]]:
            nc = await connect(server.url)
            js = nc.jetstream()
            info = await js.stream_info("SENSORS")
            out = []
            for seq in range(1, info.state.last_seq + 1):
                m = await js.get_msg("SENSORS", seq)
                out.append((m.subject, m.data))
            await nc.close()
            return out

        asyncio.run(make_stream())
        assert server.mqtt_port is not None
        _mqtt_publish(server.mqtt_port, "sensors/dev1/temp", b'{"t": 21.5}')
        from tests.helpers import wait_for

        wait_for(lambda: asyncio.run(stored()) != [], timeout=10)
        assert asyncio.run(stored()) == [("sensors.dev1.temp", b'{"t": 21.5}')]


def test_a_listen_address_must_be_host_and_port():
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        split_listen("1883")
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        split_listen("0.0.0.0:99999")
    assert split_listen("0.0.0.0:0") == ("0.0.0.0", 0)


def test_a_reload_returns_once_applied_and_a_refused_configuration_is_an_error(
    tmp_path: Path,
) -> None:
    with EmbeddedNats(tmp_path / "nats") as server:
        server.reload()  # returns after the server's own "Reloaded" line
        log = (tmp_path / "nats" / "nats.log").read_text()
        assert log.count("Reloaded server configuration") == 1
        server._config = lambda ports: "listen: 127.0.0.1:1\nbroken {{{\n"  # type: ignore[method-assign]
        with pytest.raises(NatsError, match="refused its new configuration"):
            server.reload()
        assert server.pid is not None and server._proc is not None
        assert server._proc.poll() is None  # the old configuration stays in force
