from __future__ import annotations

import asyncio
import os
import socket

import pytest

from spanflow.errors import NatsError
from spanflow.nats import EmbeddedNats
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
