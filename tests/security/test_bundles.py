"""A credential bundle per host and role: what an edge host holds is enough for its
role and nothing more — read from the bundle's files — and it works against real
servers and a real coordinator; a node's token is its node's alone; a revoked device is
cut off at the next reload."""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from spanflow.errors import SecurityError
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.security import pki
from spanflow.security.secrets import Secrets, node_token
from tests.security.coordinators import coordinator_api

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture
def full(tmp_path: Path) -> Secrets:
    found = Secrets(tmp_path / "full")
    found.init()
    found.add_device("press-7", ("sensors.press-7.>",))
    return found


def _every_secret_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_an_edge_hosts_bundles_hold_no_secret_of_another_role(
    full: Secrets, tmp_path: Path
) -> None:
    creds = full.credentials()
    assert creds.rest_token and creds.agent_key
    agent = full.export(tmp_path / "agent", "agent", node="edge-1")
    site = full.export(tmp_path / "site", "site", site="factory")
    names = {p.relative_to(tmp_path / "agent").as_posix() for p in agent}
    assert names == {
        "ca.crt", "clients/agent.crt", "clients/agent.key", "gossip.keyring", "credentials.json",
        "control.pub",
    }  # fmt: skip
    assert full.control_key.read_text() not in _every_secret_text(tmp_path / "agent")
    assert "ca.key" not in {p.name for p in site}
    edge = _every_secret_text(tmp_path / "agent") + _every_secret_text(tmp_path / "site")
    for role in ("coordinator", "control", "reader", "route"):
        assert creds.passwords[role] not in edge, role
    assert creds.rest_token not in edge and creds.agent_key not in edge
    assert full.ca_key.read_text() not in edge
    assert node_token(creds.agent_key, "edge-2") not in edge  # another node's token
    bundle = Secrets(tmp_path / "agent").credentials()
    assert bundle.rest_token is None and set(bundle.node_tokens) == {"edge-1"}
    assert set(json.loads((tmp_path / "site" / "credentials.json").read_text())["nats"]) == {
        "agent", "device",
    }  # fmt: skip
    assert creds.passwords["leaf"] not in edge  # the shared leaf login: its own instead
    device = full.export(tmp_path / "device", "device", device="press-7")
    assert set(Secrets(tmp_path / "device").credentials().devices) == {"press-7"}
    assert creds.passwords["device"] not in _every_secret_text(device[0].parent)
    with pytest.raises(SecurityError, match="not empty"):
        full.export(tmp_path / "agent", "agent", node="edge-1")
    with pytest.raises(SecurityError, match="itself a bundle"):
        Secrets(tmp_path / "agent").export(tmp_path / "again", "reader")
    with pytest.raises(SecurityError, match="--node"):
        full.export(tmp_path / "nobody", "agent")
    with pytest.raises(SecurityError, match="runs no server"):
        full.export(tmp_path / "nobody", "agent", node="edge-1", hosts=("edge-1.example",))


def test_bundles_work_against_real_servers_and_let_nothing_else_in(
    full: Secrets, tmp_path: Path
) -> None:
    full.init(("hub.example",), renew=True)  # the hub's servers are dialled at hub.example
    full.export(tmp_path / "early", "site", site="factory")  # made before its node's
    full.export(tmp_path / "agent", "agent", node="edge-1", site="factory")
    full.export(tmp_path / "site", "site", site="factory", hosts=("factory-a.example",))
    site_secrets, agent_secrets = Secrets(tmp_path / "site"), Secrets(tmp_path / "agent")
    # the site's server has a certificate of its own: its key cannot pass for the hub
    own, shared = pki.describe(site_secrets.server_cert), pki.describe(full.server_cert)
    assert own.fingerprint != shared.fingerprint
    assert "factory-a.example" in own.hosts and "hub.example" not in own.hosts
    assert "hub.example" in shared.hosts
    assert full.server_key.read_text() not in _every_secret_text(tmp_path / "site")
    with EmbeddedNats(
        tmp_path / "hub",
        name="hub",
        domain="hub",
        leaf_listen=True,
        secrets=full,
        leaf_sites=("factory",),
    ) as hub:
        site = EmbeddedNats(
            tmp_path / "nats-site", name="factory", domain="factory",
            leaf_remote=hub.leaf_url, secrets=site_secrets,
        )  # fmt: skip
        with site:

            async def scenario() -> None:
                agent = await connect(site.url, identity=agent_secrets.identity("agent"))
                at_hub = await connect(hub.url, identity=full.identity("coordinator"))
                sub = await at_hub.subscribe("factory.readings")
                await at_hub.flush()
                deadline = time.monotonic() + 20
                while True:  # the site's own leaf login (leaf-factory) links it to the hub
                    await agent.publish("factory.readings", b"42")
                    try:
                        assert (await sub.next_msg(timeout=0.5)).data == b"42"
                        break
                    except TimeoutError:
                        assert time.monotonic() < deadline, "the site's leaf link never came up"
                await at_hub.close()
                await agent.close()
                # the site's server admits no coordinator or control user at all
                for role in ("coordinator", "control"):
                    with pytest.raises(SecurityError):
                        await connect(site.url, identity=full.identity(role))
                with pytest.raises(SecurityError, match="no password for role 'coordinator'"):
                    agent_secrets.identity("coordinator")

            asyncio.run(scenario())
        early = EmbeddedNats(
            tmp_path / "nats-early", name="early", secrets=Secrets(tmp_path / "early")
        )
        with early, pytest.raises(SecurityError, match="export the hub's and its site's"):
            asyncio.run(connect(early.url, identity=agent_secrets.identity("agent")))


def test_a_site_bundle_carries_its_own_devices_logins_only(full: Secrets, tmp_path: Path) -> None:
    """A device added for a site is in that site's bundle alone: a stolen site host
    cannot log in as another site's devices, and another site's server refuses them."""
    full.add_device("saw-9", ("sensors.saw-9.>",), site="edge-b")
    full.add_device("drill-1", ("sensors.drill-1.>",), site="edge-a")
    full.export(tmp_path / "site-a", "site", site="edge-a")
    bundle = Secrets(tmp_path / "site-a")
    # press-7 was added before sites were named: every site's bundle carries it
    assert set(bundle.credentials().devices) == {"drill-1", "press-7"}
    text = _every_secret_text(tmp_path / "site-a")
    assert full.credentials().devices["saw-9"].password not in text
    assert not bundle.device_cert("saw-9").exists()
    with EmbeddedNats(tmp_path / "nats-a", name="edge-a", domain="edge-a", secrets=bundle) as a:

        async def scenario() -> None:
            drill = await connect(a.url, identity=full.device_identity("drill-1"))
            await drill.close()
            with pytest.raises(SecurityError):
                await connect(a.url, identity=full.device_identity("saw-9"))

        asyncio.run(scenario())


TOPOLOGY = """
sites: [{name: edge-a}, {name: cloud, kind: cloud}]
nodes:
  - {name: a1, site: edge-a}
  - {name: a2, site: edge-a}
  - {name: c1, site: cloud}
"""


@pytest.fixture
def api(full: Secrets, tmp_path: Path) -> Iterator[TestClient]:
    with coordinator_api(full, tmp_path, TOPOLOGY, heartbeat_interval=5.0) as (client, _):
        yield client


def test_a_node_token_registers_and_sheds_as_its_node_and_does_nothing_else(
    api: TestClient, full: Secrets, tmp_path: Path
) -> None:
    full.export(tmp_path / "agent", "agent", node="a1")
    token = Secrets(tmp_path / "agent").credentials().api_token("a1")
    assert token is not None
    mine = {"Authorization": f"Bearer {token}"}
    body = {"name": "a1", "site": "edge-a", "agent_id": "agent-a1"}
    assert api.post("/api/v1/nodes", json=body, headers=mine).status_code == 201
    other = {**body, "name": "a2", "agent_id": "agent-a2"}
    refused = api.post("/api/v1/nodes", json=other, headers=mine)
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    for method, path in (
        ("GET", "/api/v1/nodes"),
        ("POST", "/api/v1/pipelines"),
        ("POST", "/api/v1/nodes/a2/shed"),
        ("POST", "/api/v1/nodes/a1/drain"),
        ("GET", "/metrics"),
    ):
        answer = api.request(method, path, headers=mine, json={})
        assert answer.status_code == 403, (method, path, answer.text)
    forged = {"Authorization": f"Bearer {token[:-2]}xx"}
    assert api.post("/api/v1/nodes", json=body, headers=forged).status_code == 401
    operator = {"Authorization": f"Bearer {full.credentials().rest_token}"}
    assert api.get("/api/v1/nodes", headers=operator).status_code == 200


def test_a_node_token_reports_its_own_executor_allocation_only(
    api: TestClient, full: Secrets, tmp_path: Path
) -> None:
    full.export(tmp_path / "agent", "agent", node="a1")
    token = Secrets(tmp_path / "agent").credentials().api_token("a1")
    mine = {"Authorization": f"Bearer {token}"}
    body = {"name": "a1", "site": "edge-a", "agent_id": "agent-a1"}
    assert api.post("/api/v1/nodes", json=body, headers=mine).status_code == 201
    report = {
        "executors_before": 1,
        "executors": 2,
        "min_executors": 1,
        "max_executors": 3,
        "cores": 2,
        "memory_mb": 2048,
        "pressure": 1.8,
        "reason": "batch pressure 1.80 above 1 for 10 s",
    }
    answer = api.post("/api/v1/nodes/a1/scaled", json=report, headers=mine)
    assert answer.status_code == 200 and answer.json()["executors"] == 2, answer.text
    assert api.post("/api/v1/nodes/a2/scaled", json=report, headers=mine).status_code == 403
    outside = api.post("/api/v1/nodes/a1/scaled", json={**report, "executors": 4}, headers=mine)
    assert outside.status_code == 422 and "outside 1:3" in outside.text
    extra = api.post("/api/v1/nodes/a1/scaled", json={**report, "why": 1}, headers=mine)
    assert extra.status_code == 422
    operator = {"Authorization": f"Bearer {full.credentials().rest_token}"}
    log = api.get("/api/v1/cluster/log?limit=100", headers=operator).json()
    scaled = [r["detail"] for r in log if r["kind"] == "node-scaled"]
    bounds = ("min_executors", "max_executors")
    assert scaled == [{"node": "a1", **{k: v for k, v in report.items() if k not in bounds}}]


def test_a_revoked_device_is_cut_off_at_the_reload(full: Secrets, tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats", secrets=full) as server:

        async def scenario() -> None:
            identity = full.device_identity("press-7")
            device = await connect(server.url, identity=identity)
            full.revoke_device("press-7")
            server.reload()
            deadline = time.monotonic() + 15
            while device.is_connected:
                assert time.monotonic() < deadline, "the revoked device is still connected"
                await asyncio.sleep(0.1)
            with pytest.raises(SecurityError):
                await connect(server.url, identity=identity)
            await device.close()

        asyncio.run(scenario())


def _routes(monitor: str) -> int:
    import httpx

    try:
        return int(httpx.get(f"http://{monitor}/routez", timeout=2).json()["num_routes"])
    except (httpx.HTTPError, ValueError, KeyError):
        return -1


def _refused_a_route(server: EmbeddedNats) -> bool:
    text = (server.data_dir / "nats.log").read_text(errors="replace")
    return "Authorization Violation" in text or "authentication error" in text.lower()


def test_a_site_bundle_routes_its_own_sites_servers_and_nothing_else(
    full: Secrets, tmp_path: Path
) -> None:
    """A clustered edge site's servers route to each other with their site's password;
    the same bundle cannot route into the hub's cluster or another site's."""
    from spanflow.local.server import free_port
    from tests.helpers import wait_for

    for name, site in (("a1", "factory-a"), ("a2", "factory-a"), ("b", "factory-b")):
        full.export(tmp_path / name, "site", site=site)
    a1, a2, b = (Secrets(tmp_path / n) for n in ("a1", "a2", "b"))
    assert a1.credentials().site_route == a2.credentials().site_route
    assert b.credentials().site_route not in (a1.credentials().site_route, None)
    assert full.credentials().passwords["route"] not in _every_secret_text(tmp_path / "a1")

    ports = {name: free_port() for name in ("hub-1", "hub-2", "factory-a-1", "factory-a-2")}

    def server(name: str, cluster: str, secrets: Secrets, site: str | None, peer: str):  # type: ignore[no-untyped-def]
        # (a clustered JetStream server needs a route to start: the peer may be away)
        monitor = f"127.0.0.1:{free_port()}"
        made = EmbeddedNats(
            tmp_path / f"nats-{name}", name=name, cluster_name=cluster,
            cluster_port=ports.get(name) or free_port(),
            routes=(f"nats-route://127.0.0.1:{ports[peer]}",), secrets=secrets,
            route_site=site, monitor_listen=monitor,
        )  # fmt: skip
        return made, monitor

    hub, hub_monitor = server("hub-1", "hub", full, None, "hub-2")
    first, first_monitor = server("factory-a-1", "factory-a", a1, "factory-a", "factory-a-2")
    with hub, first:
        second, _ = server("factory-a-2", "factory-a", a2, "factory-a", "factory-a-1")
        with second:
            wait_for(lambda: _routes(first_monitor) >= 1, timeout=30)  # its own site: routed
        wait_for(lambda: _routes(first_monitor) == 0, timeout=30)
        intruder, _ = server("factory-a-9", "hub", a1, "factory-a", "hub-1")
        with intruder:  # an edge host's bundle dialling the hub's routes
            wait_for(lambda: _refused_a_route(hub), timeout=30)
            assert _routes(hub_monitor) == 0
        stranger, _ = server("factory-b-1", "factory-a", b, "factory-b", "factory-a-1")
        with stranger:  # another site's bundle dialling this site's routes
            wait_for(lambda: _refused_a_route(first), timeout=30)
            assert _routes(first_monitor) == 0
