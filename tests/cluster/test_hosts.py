"""spanflow across hosts: a cloud host and a factory host, each in its own network
namespace with its own address, everything locked (TLS, role users, device logins).
A device in the factory publishes over MQTT to its site server; the hub, on the cloud
host, sources the factory's stream over an authenticated leaf link; a coordinator and
a node agent (Spark, from its own bundle: NATS user ``agent.n1``) on the cloud host
count the readings in 10 s windows. A 30 s cut
of the factory's link is survived: the device is acknowledged throughout (its readings
are stored at the edge), and after the cut the cloud has every reading exactly once and
its windows count each once."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from nats.js.api import ExternalStream, StreamConfig, StreamSource

from spanflow.demo.hosts import hub_args
from spanflow.local.hosts import Host, Hosts, can_make_hosts
from spanflow.nats.streams import connect
from spanflow.security.https import client_context
from spanflow.security.secrets import SECRETS_ENV, Secrets
from tests.cluster.host_kit import (
    TOPOLOGY,
    Api,
    ids,
    plant_windows,
    rows,
    status,
    wait_line,
    window_counts,
    window_of,
)
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

DEVICE = Path(__file__).with_name("mqtt_device.py")
WINDOWS = plant_windows("PLANT_AT_HUB")
READINGS = 200
INTERVAL = 0.25  # 50 s of readings: before, during and after a 30 s cut


async def _setup_streams(hub: str, factory: str, secrets: Secrets) -> None:
    admin = secrets.identity("coordinator")
    edge = await connect(factory, identity=admin)
    await edge.jetstream().add_stream(StreamConfig(name="PLANT", subjects=["plant.>"]))
    await edge.close()
    cloud = await connect(hub, identity=admin)
    source = StreamSource(name="PLANT", external=ExternalStream(api="$JS.factory-a.API"))
    await cloud.jetstream().add_stream(StreamConfig(name="PLANT_AT_HUB", sources=[source]))
    await cloud.close()


def _rest_needs_the_token_from_another_host(
    net: Hosts,
    cloud: Host,
    hub_url: str,
    secrets: Secrets,
    env: dict[str, str],
    tmp: Path,
    topology: Path,
) -> str:
    """The coordinator on the cloud host's address: from this machine (another
    address) a call without the token is refused, with it answered."""
    log = tmp / "coordinator.log"
    net.run(
        cloud,
        [
            sys.executable,
            "-m",
            "spanflow.cli",
            "coordinator",
            "--nats",
            hub_url,
            "--host",
            cloud.address,
            "--port",
            "7070",
            "--data-dir",
            str(tmp / "coordinator"),
            "--topology",
            str(topology),
            "--heartbeat",
            "0.5",
        ],
        log=log,
        env=env,
    )
    assert "token required" in wait_line(log, r"coordinator on \S+ .*").group(0)
    base = f"https://{cloud.address}:7070"  # beyond loopback, locked: HTTPS only
    ca = client_context(secrets)
    wait_for(lambda: status(f"{base}/healthz", verify=ca) == 200, timeout=60)
    assert status(f"http://{cloud.address}:7070/healthz") == 0  # no plain HTTP
    assert status(f"{base}/healthz") == 0  # a client that does not trust our CA
    assert status(f"{base}/api/v1/nodes", verify=ca) == 401
    assert status(f"{base}/api/v1/nodes", wrong="not-the-token", verify=ca) == 401
    token = secrets.credentials().rest_token or ""
    assert status(f"{base}/api/v1/nodes", token=token, verify=ca) == 200
    assert token not in log.read_text()
    return base


def test_a_locked_factory_survives_a_cut_across_namespaced_hosts(tmp_path: Path) -> None:
    why_not = can_make_hosts()
    assert why_not is None, why_not
    with Hosts() as net:
        cloud, factory = net.add("cloud"), net.add("factory")
        secrets = Secrets(tmp_path / "secrets")
        secrets.init(hosts=(cloud.address, factory.address))
        password = secrets.add_device("press-7", ("plant.press-7.>",))
        n1 = tmp_path / "n1-secrets"  # the node's own bundle: NATS user agent.n1
        secrets.export(n1, "agent", node="n1", site="cloud")
        env = {SECRETS_ENV: str(secrets.root), "PYTHONUNBUFFERED": "1"}
        cli = [sys.executable, "-m", "spanflow.cli", "site-server"]
        hub_log, site_log = tmp_path / "hub.log", tmp_path / "site.log"
        net.run(
            cloud,
            [sys.executable, "-m", "spanflow.cli", *hub_args(cloud.address, tmp_path / "cloud")],
            log=hub_log,
            env=env,
        )
        hub_url = wait_line(hub_log, r"site hub: NATS (\S+)").group(1)
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
        site_url = wait_line(site_log, r"site factory-a: NATS (\S+)").group(1)
        wait_line(site_log, r"MQTT listener on")
        assert hub_url.startswith("tls://10.") and site_url.startswith("tls://10.")
        asyncio.run(_setup_streams(hub_url, site_url, secrets))
        topology = tmp_path / "topology.yaml"
        topology.write_text(TOPOLOGY)
        base = _rest_needs_the_token_from_another_host(
            net, cloud, hub_url, secrets, env, tmp_path, topology
        )
        api = Api(base, secrets.credentials().rest_token or "", client_context(secrets))
        net.run(
            cloud,
            [
                sys.executable,
                "-m",
                "spanflow.cli",
                "node",
                "--name",
                "n1",
                "--site",
                "cloud",
                "--coordinator",
                base,
                "--state-dir",
                str(tmp_path / "n1"),
            ],
            log=tmp_path / "node.log",
            env={**env, SECRETS_ENV: str(n1), "SPARK_LOCAL_IP": "127.0.0.1"},
        )
        wait_for(lambda: api.node_state("n1") == "alive", timeout=240)
        api.submit(WINDOWS)

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
            lambda: sum(asyncio.run(ids(hub_url, "PLANT_AT_HUB", secrets)).values()) >= 20,
            timeout=60,
        )
        net.cut(factory)
        cut_at = time.monotonic()
        time.sleep(30)  # the cut itself is the condition under test: 30 s without a link
        net.heal(factory)
        print(f"link cut for {time.monotonic() - cut_at:.1f} s")
        assert device.wait(timeout=120) == 0
        assert wait_line(device_log, r"acked (\d+)").group(1) == str(READINGS)
        expected = Counter([*range(READINGS), -1])  # -1 closes the windows
        assert asyncio.run(ids(site_url, "PLANT", secrets)) == expected  # all stored at the edge
        wait_for(
            lambda: sum(asyncio.run(ids(hub_url, "PLANT_AT_HUB", secrets)).values()) >= READINGS,
            timeout=180,
        )
        assert asyncio.run(ids(hub_url, "PLANT_AT_HUB", secrets)) == expected
        # The cloud's windows count every reading exactly once.
        readings = asyncio.run(rows(site_url, "PLANT", secrets))
        want = Counter(window_of(r["ts"]) for r in readings if r["id"] >= 0)
        wait_for(lambda: window_counts(hub_url, secrets) == want, timeout=240)
        emitted = asyncio.run(rows(hub_url, "PLANT_WINDOWS", secrets))
        assert len(emitted) == len(want), "a window was emitted twice"
        for log in (hub_log, site_log):
            text = log.read_text()
            assert password not in text and secrets.credentials().passwords["leaf"] not in text
