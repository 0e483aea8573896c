"""A stolen site host leafs into the hub with a server of its own: a stock nats-server
(configured here, not by spanflow), no JetStream of its own, and exactly what the
site's bundle holds — the leaf certificate and password. Through that link it asks the
hub's JetStream API (its own-domain prefix and ``$JS.hub.API``) to purge and delete a
stream, and publishes puts onto the hub's assignment, fence and model buckets. The hub
applies the leaf user's permissions (security/nats_config.py ``LEAF_DENY``): nothing
changes. Reads still cross (a stream's info answers), so the link the attack used works."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

import nats
from spanflow.nats.server import EmbeddedNats, nats_server_binary
from spanflow.nats.streams import connect
from spanflow.security.secrets import Secrets

BUCKETS = ("spanflow_assignments", "spanflow_fences", "SPANFLOW_MODEL_INDEX")


def _stock_leaf(
    root: Path, bundle: Secrets, hub_leaf_url: str, user: str = "leaf-edge-a"
) -> tuple[subprocess.Popen[bytes], int]:
    """A nats-server of the attacker's own: plain client port, one leaf remote with the
    site bundle's leaf certificate and password (logging in as ``user``), no accounts,
    no JetStream."""
    password = bundle.credentials().site_leaf
    host_port = hub_leaf_url.removeprefix("nats-leaf://")
    remote = {
        "url": f"nats-leaf://{user}:{password}@{host_port}",
        "tls": {
            "ca_file": str(bundle.ca_cert),
            "cert_file": str(bundle.client_cert("leaf")),
            "key_file": str(bundle.client_key("leaf")),
        },
    }
    root.mkdir(parents=True)
    config = root / "stock.conf"
    config.write_text(
        f"listen: 127.0.0.1:-1\nports_file_dir: {json.dumps(str(root))}\n"
        f"leafnodes {{ remotes: [{json.dumps(remote)}] }}\n"
    )
    log = (root / "stock.log").open("wb")
    proc = subprocess.Popen([nats_server_binary(), "-c", str(config)], stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while not list(root.glob("*.ports")):
        assert time.monotonic() < deadline and proc.poll() is None, "stock server did not start"
        time.sleep(0.05)
    ports = json.loads(next(root.glob("*.ports")).read_text())
    return proc, int(ports["nats"][0].rsplit(":", 1)[1])


@pytest.fixture
def full(tmp_path: Path) -> Secrets:
    found = Secrets(tmp_path / "full")
    found.init()
    return found


def test_a_site_bundles_leaf_link_cannot_administer_or_write_the_hub(
    full: Secrets, tmp_path: Path
) -> None:
    full.export(tmp_path / "site", "site", site="edge-a")
    bundle = Secrets(tmp_path / "site")
    with _hub(full, tmp_path) as hub:
        proc, port = _stock_leaf(tmp_path / "stock", bundle, hub.leaf_url)
        try:
            asyncio.run(_attack(hub.url, full, port))
        finally:
            proc.terminate()
            proc.wait(10)


def _hub(full: Secrets, tmp_path: Path) -> EmbeddedNats:
    """The hub, admitting the leaf links of sites edge-a and edge-b, each its own login."""
    return EmbeddedNats(
        tmp_path / "hub",
        name="hub",
        domain="hub",
        leaf_listen=True,
        secrets=full,
        leaf_sites=("edge-a", "edge-b"),
    )


def test_a_site_bundle_leafs_in_as_its_own_site_only(full: Secrets, tmp_path: Path) -> None:
    """edge-a's bundle holds edge-a's leaf login and not the shared one: as edge-b, or
    as the shared ``leaf`` user, the hub refuses it."""
    full.export(tmp_path / "site", "site", site="edge-a")
    bundle = Secrets(tmp_path / "site")
    assert "leaf" not in bundle.credentials().passwords
    with _hub(full, tmp_path) as hub:
        for user in ("leaf-edge-b", "leaf"):
            root = tmp_path / f"stock-{user}"
            proc, _ = _stock_leaf(root, bundle, hub.leaf_url, user=user)
            try:
                deadline = time.monotonic() + 20
                log = root / "stock.log"
                while "authorization violation" not in log.read_text(errors="replace").lower():
                    assert time.monotonic() < deadline, f"{user}: never refused"
                    time.sleep(0.1)
            finally:
                proc.terminate()
                proc.wait(10)


async def _attack(hub_url: str, full: Secrets, port: int) -> None:
    coordinator = await connect(hub_url, identity=full.identity("coordinator"))
    js = coordinator.jetstream()
    await js.add_stream(name="SENSORS", subjects=["sensors.>"])
    for i in range(3):
        await js.publish(f"sensors.p{i}", b"{}")
    buckets = {name: await js.create_key_value(bucket=name) for name in BUCKETS}
    for kv in buckets.values():
        await kv.put("n1.p-f1", b"genuine")
    attacker = await nats.connect(f"nats://127.0.0.1:{port}")

    deadline = time.monotonic() + 20
    while True:  # the link is up once a read crosses it
        try:
            info = await attacker.request("$JS.hub.API.STREAM.INFO.SENSORS", b"", timeout=1)
            if b"stream_info_response" in info.data:
                break
        except (NoRespondersError, NatsTimeout):
            pass
        assert time.monotonic() < deadline, "the leaf link never came up"
        await asyncio.sleep(0.2)

    for api in ("$JS.API", "$JS.hub.API"):
        for action in ("PURGE", "DELETE"):
            with pytest.raises((NoRespondersError, NatsTimeout)):
                await attacker.request(f"{api}.STREAM.{action}.SENSORS", b"", timeout=1)
        with pytest.raises((NoRespondersError, NatsTimeout)):
            body = json.dumps({"name": "SENSORS", "subjects": ["sensors.>"], "max_msgs": 1})
            await attacker.request(f"{api}.STREAM.UPDATE.SENSORS", body.encode(), timeout=1)
    for name in BUCKETS:
        await attacker.publish(f"$KV.{name}.n1.p-f1", b"forged")
        await attacker.publish(
            f"$KV.{name}.n1.p-f1", b"", headers={"KV-Operation": "PURGE", "Nats-Rollup": "sub"}
        )
        await attacker.publish(f"$KV.{name}.n9.new", b"forged")
    await attacker.flush()
    await asyncio.sleep(0.5)  # give a forged put the time it would take to land

    assert (await js.stream_info("SENSORS")).state.messages == 3
    assert (await js.stream_info("SENSORS")).config.max_msgs in (None, -1)
    for name, kv in buckets.items():
        assert (await kv.get("n1.p-f1")).value == b"genuine", name
        assert await kv.keys() == ["n1.p-f1"], name
    await attacker.close()
    await coordinator.close()
