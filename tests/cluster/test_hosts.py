"""spanflow across hosts: a cloud host and a factory host, each in its own network
namespace with its own address, everything locked (TLS, role users, device logins).
A device in the factory publishes over MQTT to its site server; the hub, on the cloud
host, sources the factory's stream over an authenticated leaf link. A 30 s cut of the
factory's link is survived: the device is acknowledged throughout (its readings are
stored at the edge), and after the cut the cloud has every reading exactly once."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from nats.js.api import ExternalStream, StreamConfig, StreamSource

from spanflow.local.hosts import Hosts, can_make_hosts
from spanflow.nats.streams import connect
from spanflow.security.secrets import SECRETS_ENV, Secrets
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

DEVICE = Path(__file__).with_name("mqtt_device.py")
READINGS = 200
INTERVAL = 0.25  # 50 s of readings: before, during and after a 30 s cut


def _wait_line(log: Path, pattern: str, timeout: float = 60.0) -> re.Match[str]:
    found: list[re.Match[str]] = []

    def seen() -> bool:
        match = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if match:
            found.append(match)
        return match is not None

    try:
        wait_for(seen, timeout=timeout, interval=0.2)
    except AssertionError:
        raise AssertionError(f"no {pattern!r} in {log}:\n{log.read_text()[-3000:]}") from None
    return found[0]


async def _setup_streams(hub: str, factory: str, secrets: Secrets) -> None:
    admin = secrets.identity("coordinator")
    edge = await connect(factory, identity=admin)
    await edge.jetstream().add_stream(StreamConfig(name="PLANT", subjects=["plant.>"]))
    await edge.close()
    cloud = await connect(hub, identity=admin)
    source = StreamSource(name="PLANT", external=ExternalStream(api="$JS.factory-a.API"))
    await cloud.jetstream().add_stream(StreamConfig(name="PLANT_AT_HUB", sources=[source]))
    await cloud.close()


async def _ids(url: str, stream: str, secrets: Secrets) -> Counter[int]:
    nc = await connect(url, identity=secrets.identity("reader"))
    try:
        js = nc.jetstream()
        total = (await js.stream_info(stream)).state.messages
        seen: Counter[int] = Counter()
        if total:
            sub = await js.subscribe(">", ordered_consumer=True, stream=stream)
            for _ in range(total):
                msg = await sub.next_msg(timeout=5)
                seen[orjson.loads(msg.data)["id"]] += 1
            await sub.unsubscribe()
        return seen
    finally:
        await nc.close()


def test_a_locked_factory_survives_a_cut_across_namespaced_hosts(tmp_path: Path) -> None:
    why_not = can_make_hosts()
    assert why_not is None, why_not
    with Hosts() as net:
        cloud, factory = net.add("cloud"), net.add("factory")
        secrets = Secrets(tmp_path / "secrets")
        secrets.init(hosts=(cloud.address, factory.address))
        password = secrets.add_device("press-7", ("plant.press-7.>",))
        env = {SECRETS_ENV: str(secrets.root), "PYTHONUNBUFFERED": "1"}
        cli = [sys.executable, "-m", "spanflow.cli", "site-server"]
        hub_log, site_log = tmp_path / "hub.log", tmp_path / "site.log"
        net.run(
            cloud,
            [
                *cli,
                "--site",
                "hub",
                "--listen",
                f"{cloud.address}:4222",
                "--leaf-listen",
                f"{cloud.address}:7422",
                "--data-dir",
                str(tmp_path / "cloud"),
            ],
            log=hub_log,
            env=env,
        )
        hub_url = _wait_line(hub_log, r"site hub: NATS (\S+)").group(1)
        net.run(
            factory,
            [
                *cli,
                "--site",
                "factory-a",
                "--hub",
                f"nats-leaf://{cloud.address}:7422",
                "--listen",
                f"{factory.address}:4222",
                "--mqtt-listen",
                f"{factory.address}:1883",
                "--data-dir",
                str(tmp_path / "factory"),
            ],
            log=site_log,
            env=env,
        )
        site_url = _wait_line(site_log, r"site factory-a: NATS (\S+)").group(1)
        _wait_line(site_log, r"MQTT listener on")
        assert hub_url.startswith("tls://10.") and site_url.startswith("tls://10.")
        asyncio.run(_setup_streams(hub_url, site_url, secrets))

        device_log = tmp_path / "device.log"
        device = net.run(
            factory,
            [
                sys.executable,
                str(DEVICE),
                factory.address,
                "1883",
                "press-7",
                password,
                str(secrets.ca_cert),
                str(READINGS),
                str(INTERVAL),
            ],
            log=device_log,
        )
        wait_for(
            lambda: sum(asyncio.run(_ids(hub_url, "PLANT_AT_HUB", secrets)).values()) >= 20,
            timeout=60,
        )
        net.cut(factory)
        cut_at = time.monotonic()
        time.sleep(30)  # the cut itself is the condition under test: 30 s without a link
        net.heal(factory)
        print(f"link cut for {time.monotonic() - cut_at:.1f} s")
        assert device.wait(timeout=120) == 0
        assert _wait_line(device_log, r"acked (\d+)").group(1) == str(READINGS)
        expected = Counter(range(READINGS))
        assert asyncio.run(_ids(site_url, "PLANT", secrets)) == expected  # all stored at the edge
        wait_for(
            lambda: sum(asyncio.run(_ids(hub_url, "PLANT_AT_HUB", secrets)).values()) >= READINGS,
            timeout=180,
        )
        assert asyncio.run(_ids(hub_url, "PLANT_AT_HUB", secrets)) == expected
        for log in (hub_log, site_log):
            text = log.read_text()
            assert password not in text and secrets.credentials().passwords["leaf"] not in text
