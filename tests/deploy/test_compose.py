"""deploy/compose/ run as an operator runs it (`podman compose up -d`, every door
locked): a hub of three NATS servers and three coordinators, a cloud node, two edge
sites with MQTT. A pipeline submitted through the hub's REST API is placed at the edge
and in the cloud; a device's readings over MQTT at an edge site are all acknowledged
(stored) while the cloud node's container is killed and restarted by the engine, the
node comes back, and every reading is in the cloud's windows exactly once. Each role's
container holds only its own credential bundle; each role's health check answers."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import paho.mqtt.client as paho
import pytest

from spanflow.local.podman import Podman
from spanflow.local.server import free_port
from spanflow.security.https import client_context
from spanflow.security.secrets import Secrets
from tests.cluster.host_kit import window_counts
from tests.deploy.conftest import volume_path
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"
PROJECT = f"sft{os.getpid()}"
READINGS = 80
TOPIC = "plant/edge-a/press-7/temp"
ROLES = {  # container → what its bundle must not hold (another role's secrets)
    "edge-a-nats": ("coordinator", "control", "reader", "route"),
    "edge-a-1": ("coordinator", "control", "reader", "route", "leaf", "device"),
    "cloud-1": ("coordinator", "control", "reader", "route", "leaf", "device"),
}


class Stack:
    def __init__(self, podman: Podman, image: str) -> None:
        self.podman = podman
        self.ports = {
            name: free_port()
            for name in ("NATS_PORT_1", "NATS_PORT_2", "NATS_PORT_3", "REST_PORT_1",
                         "REST_PORT_2", "REST_PORT_3", "MQTT_PORT_A", "MQTT_PORT_B")
        }  # fmt: skip
        self.podman.env.update({f"SPANFLOW_{k}": str(v) for k, v in self.ports.items()})
        self.podman.env["SPANFLOW_IMAGE"] = image

    def compose(self, *args: str, check: bool = True) -> str:
        done = self.podman.command(
            ["podman-compose", "-p", PROJECT, "-f", str(COMPOSE / "compose.yaml"), *args],
            check=check,
            cwd=COMPOSE,
            timeout=600,
        )
        return done.stdout

    def container(self, service: str) -> str:
        return f"{PROJECT}_{service}_1"

    def secrets(self) -> Secrets:
        return Secrets(volume_path(self.podman, f"{PROJECT}_secrets") / "full")

    @property
    def hub(self) -> str:
        return ",".join(f"tls://127.0.0.1:{self.ports[f'NATS_PORT_{i}']}" for i in (1, 2, 3))


@pytest.fixture
def stack(podman: Podman, image: str) -> Iterator[Stack]:
    made = Stack(podman, image)
    made.compose("up", "-d")
    try:
        yield made
    finally:
        for service in ("cloud-1", "coordinator-1", "edge-a-1"):
            said = podman("logs", "--tail", "40", made.container(service), check=False)
            print(f"--- {service}\n{said.stdout[-3000:]}{said.stderr[-3000:]}")
        made.compose("down", "-v", check=False)


def _api(stack: Stack, secrets: Secrets) -> httpx.Client:
    """A client of whichever coordinator leads (a standby redirects writes to the
    leader's advertised name, which only the containers resolve)."""
    token = secrets.credentials().rest_token or ""
    for i in (1, 2, 3):
        base = f"https://127.0.0.1:{stack.ports[f'REST_PORT_{i}']}"
        client = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {token}"},
            verify=client_context(secrets), timeout=30,
        )  # fmt: skip
        try:
            if client.get("/api/v1/cluster").json().get("role") == "leader":
                return client
        except (httpx.HTTPError, ValueError):
            pass
        client.close()
    raise AssertionError("no coordinator leads")


def _leader_client(stack: Stack, secrets: Secrets) -> httpx.Client | None:
    try:
        return _api(stack, secrets)
    except AssertionError:
        return None


def _alive(api: httpx.Client) -> set[str]:
    try:
        return {n["name"] for n in api.get("/api/v1/nodes").json() if n["state"] == "alive"}
    except (httpx.HTTPError, ValueError):
        return set()


def _fragments_running(api: httpx.Client) -> set[str]:
    """The nodes where a fragment of the example pipeline runs."""
    try:
        found = api.get("/api/v1/pipelines/plant-windows").json()["fragments"]
    except (httpx.HTTPError, ValueError, KeyError):
        return set()
    return {f["node"] for f in found if f["status"] == "running"}


def _device(port: int, secrets: Secrets) -> paho.Client:
    password = secrets.credentials().devices["press-7"].password
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="press-7-device")
    client.username_pw_set("press-7", password)
    client.tls_set(ca_certs=str(secrets.ca_cert))
    client.max_inflight_messages_set(100)
    client.connect("127.0.0.1", port, keepalive=10)
    client.loop_start()
    return client


def _kill_inside(podman: Podman, container: str) -> None:
    """SIGKILL every process of the role inside its container (all but the init, tini),
    as a crash would: the engine sees the container exit and restarts it."""
    podman("exec", container, "sh", "-c", "kill -9 -1",
           check=False)  # fmt: skip


def _windows_of(readings: list[dict[str, Any]]) -> Counter[str]:
    """Readings per 10-s window (the pipeline's), keyed by the window's start."""
    out: Counter[str] = Counter()
    for r in readings:
        at = datetime.fromisoformat(r["ts"]).timestamp()
        out[datetime.fromtimestamp(at - at % 10, UTC).isoformat()[:19]] += 1
    return out


def _real_windows(stack: Stack, secrets: Secrets) -> Counter[str]:
    """The cloud's windows of the readings (not of the closing ones, an hour on), each
    window's rows summed: a window emitted twice shows as twice its count."""
    soon = (datetime.now(UTC) + timedelta(minutes=30)).isoformat()[:19]
    found = window_counts(stack.hub, secrets)
    return Counter({k: n for k, n in found.items() if k < soon})


def _restarts(podman: Podman, container: str) -> int:
    done = podman("inspect", container, "--format", "{{.RestartCount}}", check=False)
    return int(done.stdout.strip() or 0)


@pytest.mark.timeout(1800)  # the first test also builds the image (3-5 min)
def test_the_compose_project_takes_mqtt_readings_through_an_agent_crash(
    stack: Stack, podman: Podman
) -> None:
    wait_for(
        lambda: (volume_path(podman, f"{PROJECT}_secrets") / "full" / "credentials.json").exists(),
        timeout=120,
    )
    secrets = stack.secrets()
    wait_for(lambda: _leader_client(stack, secrets) is not None, timeout=240)
    api = _api(stack, secrets)
    wait_for(lambda: _alive(api) >= {"cloud-1", "edge-a-1", "edge-b-1"}, timeout=420)
    answer = api.post("/api/v1/pipelines", json={"yaml": (COMPOSE / "pipeline.yaml").read_text()})
    assert answer.status_code < 300, answer.text
    placed = {f["node"] for f in answer.json()["fragments"]}
    assert {"edge-a-1", "cloud-1"} <= placed, answer.json()["fragments"]
    # the cloud's merge runs (and checkpoints) before its container is killed
    wait_for(lambda: _fragments_running(api) >= {"edge-a-1", "cloud-1"}, timeout=300)

    device = _device(stack.ports["MQTT_PORT_A"], secrets)
    readings: list[dict[str, Any]] = []
    acks = []
    before = _restarts(podman, stack.container("cloud-1"))
    for i in range(READINGS):
        now = datetime.now(UTC).isoformat()
        readings.append({"id": i, "device": "press-7", "ts": now, "temp": 20.0 + i % 7})
        acks.append(device.publish(TOPIC, orjson.dumps(readings[-1]), qos=1))
        if i == READINGS // 2:
            _kill_inside(podman, stack.container("cloud-1"))
        time.sleep(0.25)
    # Then readings an hour apart, a few seconds apart in time, as a stream that goes on
    # does: each moves the edge's event time on (its partial counts go to the cloud),
    # and the next moves the cloud's past them, so every window of the readings closes.
    for hours in (1, 2, 3, 4):
        later = (datetime.now(UTC) + timedelta(hours=hours)).isoformat()
        closing = {"id": -hours, "device": "press-7", "ts": later, "temp": 0.0}
        acks.append(device.publish(TOPIC, orjson.dumps(closing), qos=1))
        time.sleep(3)  # the pace of the stream (separate micro-batches), not a wait
    wait_for(lambda: all(info.is_published() for info in acks), timeout=60)  # stored at the edge
    device.disconnect()
    device.loop_stop()
    wait_for(lambda: _restarts(podman, stack.container("cloud-1")) > before, timeout=120)

    wait_for(lambda: "cloud-1" in _alive(api), timeout=300)  # back, on its volume
    # Every reading in the cloud's windows, each window once: edge-b sends nothing,
    # and its watermark beats let the merge close edge-a's windows.
    expected = _windows_of(readings)
    wait_for(lambda: _real_windows(stack, secrets) == expected, timeout=420)
    assert sum(_real_windows(stack, secrets).values()) == READINGS

    for service in ("hub-nats-1", "coordinator-1", "edge-a-nats", "cloud-1", "edge-a-1"):
        done = podman("healthcheck", "run", stack.container(service), check=False)
        assert done.returncode == 0, f"{service}: {done.stdout}{done.stderr}"
    full = secrets.credentials()
    for service, foreign in ROLES.items():
        held = podman(
            "exec", stack.container(service), "cat", "/run/secrets/spanflow/credentials.json"
        )
        bundle = json.loads(held.stdout)
        assert not set(foreign) & set(bundle["nats"]), (service, sorted(bundle["nats"]))
        assert (full.rest_token or "-") not in held.stdout and "agent_key" not in bundle
        listing = podman("exec", stack.container(service), "ls", "/run/secrets/spanflow").stdout
        assert "ca.key" not in listing and "control.key" not in listing, (service, listing)
