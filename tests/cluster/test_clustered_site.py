"""A clustered edge site and a clustered hub across namespaced hosts, everything locked.

Three factory hosts each run a `spanflow site-server` of site ``factory-a``, joined in
one NATS cluster (routes over TLS); three cloud hosts each run one of the hub's. Every
factory server is a leaf of every hub server. The factory's stream has three copies.
A device publishes over MQTT to one factory server; the hub sources the factory's
stream; a coordinator and a node agent on a cloud host count the readings in 10 s
windows. During a 30 s cut of the factory's uplink, the factory host that leads the
stream is lost (its processes SIGKILLed, its link down): the device is acknowledged
throughout, and after the cut the cloud has every acknowledged reading exactly once and
its windows count each once."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from spanflow.local.hosts import Host, Hosts, can_make_hosts
from spanflow.nats.streams import connect, ensure_sourced, ensure_stream
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
WINDOWS = plant_windows("PLANT")
READINGS = 200
INTERVAL = 0.25  # 50 s of readings: before, during and after a 30 s cut
SITE = "factory-a"


def _site_servers(
    net: Hosts, hosts: list[Host], site: str, secrets: Secrets, tmp: Path, hub: str | None
) -> list[str]:
    """One `spanflow site-server` per host, clustered; their client URLs. An edge
    site's servers each hold only a site bundle naming their own host."""
    cli = [sys.executable, "-m", "spanflow.cli", "site-server", "--site", site]
    logs = []
    for i, host in enumerate(hosts):
        own = secrets.root
        if hub is not None:
            own = tmp / f"bundle-{host.name}"
            secrets.export(own, "site", site=site, hosts=(host.address,))
        env = {SECRETS_ENV: str(own), "PYTHONUNBUFFERED": "1"}
        routes = [
            a for other in hosts if other is not host for a in ("--route", f"{other.address}:6222")
        ]
        where = ["--listen", f"{host.address}:4222", "--cluster-listen", f"{host.address}:6222"]
        if hub is None:
            where += ["--leaf-listen", f"{host.address}:7422", "--leaf-site", SITE]
        else:
            where += ["--hub", hub, "--mqtt-listen", f"{host.address}:1883"]
        log = tmp / f"{site}-{i + 1}.log"
        name = ["--server-name", f"{site}-{i + 1}", "--data-dir", str(tmp / f"{site}-{i + 1}")]
        net.run(host, [*cli, *where, *routes, *name], log=log, env=env)
        logs.append(log)
    urls = [wait_line(log, rf"site {site}: NATS (\S+)").group(1) for log in logs]
    for log in logs:
        wait_line(log, rf"site {site}: JetStream cluster ready")
    return urls


async def _ready_streams(edge: str, hub: str, secrets: Secrets) -> int:
    """The factory's stream (as an agent makes it: one copy per server, up to three)
    and the hub's stream sourcing it; the factory stream's copies."""
    agent = secrets.identity("agent")  # an edge site's servers admit agents, not coordinators
    for url, make in (
        (edge, lambda js: ensure_stream(js, "PLANT", ["plant.>"])),
        (hub, lambda js: ensure_sourced(js, "PLANT", SITE)),
    ):
        nc = await connect(url, identity=agent)
        try:
            await make(nc.jetstream())
        finally:
            await nc.close()
    nc = await connect(edge, identity=agent)
    try:
        return int((await nc.jetstream().stream_info("PLANT")).config.num_replicas or 1)
    finally:
        await nc.close()


async def _leader(url: str, secrets: Secrets, *, step_down: bool = False) -> str:
    """The server leading stream PLANT at ``url``'s site (after a step-down if asked)."""
    nc = await connect(url, identity=secrets.identity("agent"))
    try:
        if step_down:
            await nc.request("$JS.API.STREAM.LEADER.STEPDOWN.PLANT", b"", timeout=10)
        for _ in range(100):
            info = await nc.jetstream().stream_info("PLANT")
            if info.cluster is not None and info.cluster.leader:
                return str(info.cluster.leader)
            await asyncio.sleep(0.1)
        raise AssertionError("stream PLANT has no leader")
    finally:
        await nc.close()


def _leader_away_from(url: str, secrets: Secrets, keep: str) -> str:
    """The stream's leader, moved off server ``keep`` (the device's) if it was there."""
    leader = asyncio.run(_leader(url, secrets))
    for _ in range(5):
        if leader != keep:
            return leader
        leader = asyncio.run(_leader(url, secrets, step_down=True))
    raise AssertionError(f"the leader of PLANT stays on {keep}")


def _stored(url: str, secrets: Secrets, role: str = "reader") -> int:
    return sum(asyncio.run(ids(url, "PLANT", secrets, role)).values())


def test_a_clustered_site_loses_a_host_during_a_cut(tmp_path: Path) -> None:
    why_not = can_make_hosts()
    assert why_not is None, why_not
    with Hosts() as net:
        cloud = [net.add(f"cloud{i}") for i in (1, 2, 3)]
        factory = [net.add(f"fact{i}") for i in (1, 2, 3)]
        secrets = Secrets(tmp_path / "secrets")
        secrets.init(hosts=tuple(h.address for h in [*cloud, *factory]))
        password = secrets.add_device("press-7", ("plant.press-7.>",))
        env = {SECRETS_ENV: str(secrets.root), "PYTHONUNBUFFERED": "1"}
        hub_urls = _site_servers(net, cloud, "hub", secrets, tmp_path, None)
        leaves = ",".join(f"nats-leaf://{h.address}:7422" for h in cloud)
        edge_urls = _site_servers(net, factory, SITE, secrets, tmp_path, leaves)
        assert all(url.startswith("tls://10.") for url in [*hub_urls, *edge_urls])
        hub, edge = ",".join(hub_urls), ",".join(edge_urls)
        assert asyncio.run(_ready_streams(edge, hub, secrets)) == 3

        topology = tmp_path / "topology.yaml"
        topology.write_text(TOPOLOGY)
        cli = [sys.executable, "-m", "spanflow.cli"]
        home = cloud[0]
        coordinator_log = tmp_path / "coordinator.log"
        net.run(
            home,
            [*cli, "coordinator", "--nats", hub, "--host", home.address, "--port", "7070",
             "--data-dir", str(tmp_path / "coordinator"), "--topology", str(topology),
             "--heartbeat", "0.5"],
            log=coordinator_log,
            env=env,
        )  # fmt: skip
        wait_line(coordinator_log, r"coordinator on \S+")
        base, ca = f"https://{home.address}:7070", client_context(secrets)
        wait_for(lambda: status(f"{base}/healthz", verify=ca) == 200, timeout=60)
        api = Api(base, secrets.credentials().rest_token or "", ca)
        net.run(
            home,
            [*cli, "node", "--name", "n1", "--site", "cloud", "--coordinator", base,
             "--state-dir", str(tmp_path / "n1")],
            log=tmp_path / "node.log",
            env={**env, "SPARK_LOCAL_IP": "127.0.0.1"},
        )  # fmt: skip
        wait_for(lambda: api.node_state("n1") == "alive", timeout=240)
        api.submit(WINDOWS)

        device_log = tmp_path / "device.log"
        device = net.run(
            factory[0],
            [sys.executable, str(DEVICE), factory[0].address, "1883", "press-7", password,
             str(secrets.ca_cert), str(READINGS), str(INTERVAL)],
            log=device_log,
        )  # fmt: skip
        wait_for(lambda: _stored(hub, secrets) >= 20, timeout=60)
        lost_name = _leader_away_from(edge, secrets, keep=f"{SITE}-1")
        lost = factory[int(lost_name.rsplit("-", 1)[1]) - 1]
        alive = ",".join(url for url, h in zip(edge_urls, factory, strict=True) if h is not lost)
        net.cut_between(factory, cloud)
        cut_at = time.monotonic()
        time.sleep(3)  # what was in flight at the cut has landed
        at_hub, at_edge = _stored(hub, secrets), _stored(alive, secrets, "agent")
        time.sleep(7)  # the cut is the condition under test: a host is lost inside it
        net.kill(lost)
        time.sleep(max(0.0, 29 - (time.monotonic() - cut_at)))
        assert _stored(hub, secrets) == at_hub, "the cut let readings through"
        assert _stored(alive, secrets, "agent") > at_edge + 40, (
            "the edge stopped storing in the cut"
        )
        time.sleep(max(0.0, 30 - (time.monotonic() - cut_at)))
        net.heal_between(factory, cloud)
        print(f"uplink cut for {time.monotonic() - cut_at:.1f} s; lost host {lost.name}")
        assert device.wait(timeout=120) == 0
        assert wait_line(device_log, r"acked (\d+)").group(1) == str(READINGS)

        expected = Counter([*range(READINGS), -1])  # -1 closes the windows
        assert (
            asyncio.run(ids(alive, "PLANT", secrets, "agent")) == expected
        )  # two copies at the edge
        wait_for(lambda: _stored(hub, secrets) >= READINGS + 1, timeout=180)
        assert asyncio.run(ids(hub, "PLANT", secrets)) == expected
        readings = asyncio.run(rows(alive, "PLANT", secrets, "agent"))
        want = Counter(window_of(r["ts"]) for r in readings if r["id"] >= 0)
        wait_for(lambda: window_counts(hub, secrets) == want, timeout=240)
        emitted = asyncio.run(rows(hub, "PLANT_WINDOWS", secrets))
        assert len(emitted) == len(want), "a window was emitted twice"
        leaf = secrets.credentials().passwords["leaf"]
        route = secrets.credentials().passwords["route"]
        site_route = secrets.credentials().route_password_for(SITE)
        assert Secrets(tmp_path / "bundle-fact1").credentials().passwords.get("route") is None
        for log in tmp_path.glob("*.log"):
            text = log.read_text()
            assert all(x not in text for x in (password, leaf, route, site_route)), log
