"""``spanflow run --mqtt``: a device that publishes at QoS 1 the instant the MQTT
listener is announced, and is acknowledged, finds every reading stored — the streams
the pipeline reads exist before the listener is announced."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import paho.mqtt.client as mqtt
import pytest

from spanflow.nats.streams import connect

ROOT = Path(__file__).resolve().parents[2]
READINGS = 40


def _lines(stream: object, out: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        out.put(line)


def _wait_for(lines: queue.Queue[str], pattern: str, seen: list[str], timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen)[-3000:]}")


def _publish_qos1(port: int) -> int:
    """Connect and publish READINGS messages at QoS 1, each acknowledged (PUBACK)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="spanflow-device-1")
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        acked = 0
        for i in range(READINGS):
            reading = {
                "device": "dev-001",
                "site": "site-a",
                "ts": f"2026-01-01T00:00:{i:02d}+00:00",
                "temperature": 20.0 + i / 10,
                "vibration": 0.5,
            }
            info = client.publish("sensors/site-a/dev-001", orjson.dumps(reading), qos=1)
            info.wait_for_publish(timeout=10)
            acked += info.is_published()
        return acked
    finally:
        client.disconnect()
        client.loop_stop()


async def _stored(url: str) -> int:
    nc = await connect(url)
    try:
        info = await nc.jetstream().stream_info("SENSORS")
        return int(info.state.messages)
    finally:
        await nc.close()


@pytest.mark.slow
def test_every_qos1_reading_published_at_the_announcement_is_stored(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spanflow.cli",
            "run",
            str(ROOT / "examples" / "sensor_alerts.yaml"),
            "--mqtt",
            "--data-dir",
            str(tmp_path),
            "--duration",
            "120",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, lines), daemon=True).start()
    seen: list[str] = []
    try:
        url = _wait_for(lines, r"embedded NATS at (nats://\S+)", seen, 60).group(1)
        announced = _wait_for(lines, r"MQTT listener on 127\.0\.0\.1:(\d+)", seen, 60)
        acked = _publish_qos1(int(announced.group(1)))
        assert acked == READINGS
        deadline = time.monotonic() + 10  # the server stores what it acknowledged
        while (stored := asyncio.run(_stored(url))) < READINGS and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stored == READINGS
        assert "stream SENSORS ready" in announced.string
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
