"""``spanflow site-server`` on this machine: its NATS server, the MQTT gateway and HTTP
ingest, each answering only once a reading is stored."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import paho.mqtt.client as paho
from nats.js.api import StreamConfig

from spanflow.errors import SecurityError
from spanflow.local.server import free_port
from spanflow.nats.streams import connect
from spanflow.security.secrets import Secrets


def _wait_line(log: Path, pattern: str, proc: subprocess.Popen[bytes]) -> re.Match[str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} in {log.read_text()}")


async def _make_stream(url: str) -> None:
    nc = await connect(url)
    await nc.jetstream().add_stream(StreamConfig(name="SITE_IN", subjects=["site.>"]))
    await nc.close()


async def _count(url: str) -> int:
    nc = await connect(url)
    try:
        return int((await nc.jetstream().stream_info("SITE_IN")).state.messages)
    finally:
        await nc.close()


def test_a_site_server_takes_mqtt_and_http_readings(tmp_path: Path) -> None:
    mqtt_port, http_port = free_port(), free_port()
    log = tmp_path / "site.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPANFLOW_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spanflow.cli", "site-server", "--site", "s1",
             "--listen", "127.0.0.1:0", "--mqtt-listen", f"127.0.0.1:{mqtt_port}",
             "--http-listen", f"127.0.0.1:{http_port}", "--data-dir", str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT, env=clean,
        )  # fmt: skip
    try:
        url = _wait_line(log, r"site s1: NATS (\S+)", proc).group(1)
        _wait_line(log, r"HTTP ingest on", proc)
        assert "OPEN MODE" in log.read_text()
        asyncio.run(_make_stream(url))
        r = httpx.post(f"http://127.0.0.1:{http_port}/ingest/site.http", json=[{"v": 1}, {"v": 2}])
        assert r.status_code == 200 and r.json()["stored"] == 2
        client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="d1")
        client.connect("127.0.0.1", mqtt_port)
        client.loop_start()
        info = client.publish("site/mqtt", b'{"v": 3}', qos=1)
        info.wait_for_publish(timeout=20)
        assert info.is_published()
        client.disconnect()
        client.loop_stop()
        assert asyncio.run(_count(url)) == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_a_locked_site_server_admits_a_new_device_on_sighup(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    log = tmp_path / "site.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPANFLOW_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spanflow.cli", "site-server", "--site", "s2",
             "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT, env=clean,
        )  # fmt: skip
    try:
        url = _wait_line(log, r"site s2: NATS (\S+)", proc).group(1)
        assert url.startswith("tls://") and "OPEN MODE" not in log.read_text()
        secrets.add_device("press-3", ("site.press-3.>",))
        identity = secrets.device_identity("press-3")

        async def attempt() -> bool:
            try:
                nc = await connect(url, identity=identity)
            except SecurityError:
                return False
            await nc.close()
            return True

        assert not asyncio.run(attempt())
        proc.send_signal(signal.SIGHUP)
        _wait_line(log, r"configuration reloaded", proc)
        deadline = time.monotonic() + 10
        while not asyncio.run(attempt()):
            assert time.monotonic() < deadline, "the reloaded server never admitted press-3"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_a_site_server_refuses_a_cluster_it_cannot_form(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from spanflow.cli import app

    runner = CliRunner()
    base = ["site-server", "--site", "s1", "--data-dir", str(tmp_path)]
    cases = {
        ("--route", "127.0.0.1:6222"): "--route needs --cluster-listen",
        ("--cluster-listen", "127.0.0.1:6222", "--route", "127.0.0.1:0"): "needs the server's port",
        ("--cluster-listen", "127.0.0.1:0"): "port 0 needs --server-name",
        ("--hub", "hub:7422"): "is not nats-leaf://HOST:PORT",
    }
    for args, said in cases.items():
        result = runner.invoke(app, [*base, *args])
        assert result.exit_code != 0 and said in result.output, (args, result.output)
    assert not list(tmp_path.glob("nats-*")), "a refused server left a data directory"
