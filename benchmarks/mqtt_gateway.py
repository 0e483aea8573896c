"""MQTT ingest: spanflow's gateway (a PUBACK once JetStream stored the reading) against
nats-server's own MQTT listener (a PUBACK once the server took it), same run, same
server, same client.

One paho-mqtt device publishes N readings at QoS 1 as fast as its window of
unacknowledged messages allows (``--inflight``, default 1000); the time from the first
publish to the last PUBACK gives readings/s; every reading is then counted in the
stream. The gateway is measured open and locked (TLS, a device login; the gateway
then connects to NATS as the device over TLS).

Figures are printed and written to ``benchmarks/results/mqtt_gateway.json``.
Run: ``.venv/bin/python benchmarks/mqtt_gateway.py [--readings 20000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as paho
from nats.js.api import StreamConfig

from spanflow.doors.mqtt_gateway import GatewayThread
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.security.secrets import Secrets

RESULTS = Path(__file__).resolve().parent / "results"


def publish_all(port: int, readings: int, inflight: int, login: dict[str, Any]) -> float:
    """Seconds from the first publish to the last PUBACK."""
    done = threading.Event()
    acked = [0]

    def on_publish(*_: Any) -> None:
        acked[0] += 1
        if acked[0] == readings:
            done.set()

    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"bench-{time.time_ns()}")
    client.on_publish = on_publish
    client.max_inflight_messages_set(inflight)
    client.max_queued_messages_set(0)
    if login:
        client.username_pw_set(login["user"], login["password"])
        client.tls_set(ca_certs=login["ca"])
    client.connect("127.0.0.1", port)
    client.loop_start()
    payloads = [
        orjson.dumps({"device": f"d{i % 100}", "seq": i, "temp": 20.0 + i % 13})
        for i in range(readings)
    ]
    start = time.perf_counter()
    for i, data in enumerate(payloads):
        client.publish(f"bench/d{i % 100}/temp", data, qos=1)
    if not done.wait(timeout=600):
        raise RuntimeError(f"only {acked[0]} of {readings} acknowledged")
    elapsed = time.perf_counter() - start
    client.disconnect()
    client.loop_stop()
    return elapsed


async def reset(url: str, identity: Any = None) -> None:
    nc = await connect(url, identity=identity)
    js = nc.jetstream()
    with contextlib.suppress(Exception):  # not there yet
        await js.delete_stream("BENCH")
    await js.add_stream(StreamConfig(name="BENCH", subjects=["bench.>"]))
    await nc.close()


async def stored(url: str, identity: Any = None) -> int:
    nc = await connect(url, identity=identity)
    try:
        return int((await nc.jetstream().stream_info("BENCH")).state.messages)
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readings", type=int, default=20000)
    parser.add_argument("--inflight", type=int, default=1000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spanflow-mqtt-bench-"))
    runs: list[dict[str, Any]] = []

    with EmbeddedNats(work / "open", mqtt=True) as server:
        assert server.mqtt_port is not None
        gateway = GatewayThread(server.url, "127.0.0.1", 0).start()
        try:
            for name, port in (
                ("nats-server listener", server.mqtt_port),
                ("gateway", gateway.port),
            ):
                asyncio.run(reset(server.url))
                seconds = publish_all(port, args.readings, args.inflight, {})
                runs.append(
                    {
                        "path": name,
                        "doors": "open",
                        "readings_per_s": round(args.readings / seconds),
                        "stored": asyncio.run(stored(server.url)),
                    }
                )
                print(runs[-1], flush=True)
        finally:
            gateway.stop()

    secrets = Secrets(work / "secrets")
    secrets.init()
    password = secrets.add_device("bench", ("bench.>",))
    admin = secrets.identity("coordinator")
    with EmbeddedNats(work / "locked", secrets=secrets) as server:
        gateway = GatewayThread(server.url, "127.0.0.1", 0, secrets=secrets).start()
        try:
            asyncio.run(reset(server.url, admin))
            login = {"user": "bench", "password": password, "ca": str(secrets.ca_cert)}
            seconds = publish_all(gateway.port, args.readings, args.inflight, login)
            runs.append(
                {
                    "path": "gateway",
                    "doors": "locked",
                    "readings_per_s": round(args.readings / seconds),
                    "stored": asyncio.run(stored(server.url, admin)),
                }
            )
            print(runs[-1], flush=True)
        finally:
            gateway.stop()

    base = runs[0]["readings_per_s"]
    report = {
        "benchmark": "mqtt_gateway",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "readings": args.readings,
        "inflight": args.inflight,
        "baseline": "nats-server's own MQTT listener, same server, same client, same run",
        "runs": runs,
        "ratios_to_baseline": {
            f"{r['path']} ({r['doors']})": round(r["readings_per_s"] / base, 2) for r in runs
        },
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "mqtt_gateway.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios_to_baseline"], indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
