"""A device revoked after its site's bundle was made is cut off at that site too: the
operator's signed revocation list, pushed to the hub, reaches each site server over
its leaf link; a forged, older or damaged list revokes nothing less."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.errors import Error as NatsClientError
from typer.testing import CliRunner

from spanflow.cli.common import app
from spanflow.errors import SecurityError
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.security import revocations
from spanflow.security.revocations import REVOCATIONS_BUCKET, Revocations, credential_id
from spanflow.security.secrets import SECRETS_ENV, Secrets
from spanflow.security.signing import Signer, Unsigned, new_key_pair
from tests.cluster.host_kit import wait_line


@pytest.fixture
def full(tmp_path: Path) -> Secrets:
    found = Secrets(tmp_path / "full")
    found.init()
    found.add_device("press-7", ("sensors.press-7.>",), site="edge-a")
    found.add_device("drill-1", ("sensors.drill-1.>",), site="edge-a")
    return found


def _site_bundle(full: Secrets, tmp_path: Path) -> Secrets:
    full.export(tmp_path / "site", "site", site="edge-a")
    return Secrets(tmp_path / "site")


def test_a_site_bundle_drops_what_a_newer_list_revokes_and_nothing_else(
    full: Secrets, tmp_path: Path
) -> None:
    site = _site_bundle(full, tmp_path)
    old_password = full.credentials().devices["press-7"].password
    full.revoke_device("press-7")
    assert site.store_revocations(full.revocations_file.read_bytes())
    assert set(site.credentials().devices) == {"drill-1"}
    # a device re-added under the same name has a new credential: not revoked
    full.add_device("press-7", ("sensors.press-7.>",), site="edge-a")
    listed = full.revocations()
    assert listed.revokes("press-7", old_password)
    assert not listed.revokes("press-7", full.credentials().devices["press-7"].password)


def test_forged_older_and_damaged_lists_revoke_nothing_less(full: Secrets, tmp_path: Path) -> None:
    site = _site_bundle(full, tmp_path)
    full.revoke_device("press-7")
    first = full.revocations_file.read_bytes()
    full.revoke_device("drill-1")
    assert site.store_revocations(full.revocations_file.read_bytes())
    assert site.credentials().devices == {}
    assert not site.store_revocations(first)  # a replay of the older list
    assert site.credentials().devices == {}
    other_key, _ = new_key_pair()  # a list signed by anyone but the coordinators
    forged = revocations.sign(Revocations(serial=99), Signer(other_key))
    with pytest.raises(Unsigned):
        site.store_revocations(forged)
    with pytest.raises(Unsigned):
        site.store_revocations(b'{"serial": 100, "credentials": []}')
    assert site.revocations().serial == 2
    site.revocations_file.write_bytes(b"garbage")  # a damaged file admits nobody back
    with pytest.raises(SecurityError, match="unreadable"):
        site.credentials()


def test_credential_ids_name_no_password() -> None:
    cid = credential_id("press-7", "s3cret-password")
    assert cid.startswith("press-7:") and "s3cret" not in cid
    assert cid != credential_id("press-7", "another")


def test_a_device_revoked_after_its_sites_bundle_was_made_is_cut_off_there(
    full: Secrets, tmp_path: Path
) -> None:
    """The site server runs from a bundle made before the revocation; the device logs
    in there with its own bundle and a client the project does not use for devices
    (nats-py, straight to the site's server). The operator revokes and pushes: the
    site cuts the device's session and refuses its next login; the other device
    stays in. An agent bundle can neither overwrite nor purge the hub's list."""
    site = _site_bundle(full, tmp_path)
    for name in ("press-7", "drill-1"):
        full.export(tmp_path / name, "device", device=name)
    full.export(tmp_path / "agent", "agent", node="a1")
    log = tmp_path / "site-server.log"
    with EmbeddedNats(
        tmp_path / "hub", name="hub", domain="hub", leaf_listen=True, secrets=full,
        leaf_sites=("edge-a",),
    ) as hub, open(log, "w") as out:  # fmt: skip
        env = {**os.environ, SECRETS_ENV: str(site.root), "PYTHONUNBUFFERED": "1"}
        cli = [sys.executable, "-m", "spanflow.cli", "site-server", "--site", "edge-a"]
        where = ["--hub", hub.leaf_url, "--listen", "127.0.0.1:0"]
        server = subprocess.Popen(
            [*cli, *where, "--data-dir", str(tmp_path / "edge")], env=env, stdout=out, stderr=out
        )
        try:
            url = wait_line(log, r"site edge-a: NATS (\S+)").group(1)
            asyncio.run(_revoke_and_watch(full, tmp_path, url, hub.url))
        finally:
            server.terminate()
            server.wait(30)
    assert "revocation list 1 stored" in log.read_text()


async def _revoke_and_watch(full: Secrets, tmp_path: Path, site_url: str, hub_url: str) -> None:
    press = Secrets(tmp_path / "press-7").device_identity("press-7")
    drill = Secrets(tmp_path / "drill-1").device_identity("drill-1")
    device = await connect(site_url, identity=press)
    other = await connect(site_url, identity=drill)
    full.revoke_device("press-7")
    push = ["secrets", "revocations", "--push", hub_url, "--secrets-dir", str(full.root)]
    pushed = await asyncio.to_thread(CliRunner().invoke, app, push)
    assert pushed.exit_code == 0, pushed.output
    deadline = time.monotonic() + 30
    while device.is_connected:
        assert time.monotonic() < deadline, "the site still admits the revoked device"
        await asyncio.sleep(0.2)
    with pytest.raises(SecurityError):
        await connect(site_url, identity=press)
    assert other.is_connected
    await other.publish("sensors.drill-1.t", b"1")
    await other.flush()
    await other.close()
    await device.close()
    agent = await connect(hub_url, identity=Secrets(tmp_path / "agent").identity("agent"))
    js = agent.jetstream(timeout=1.0)  # a refused publish is never answered
    try:
        kv = await js.key_value(REVOCATIONS_BUCKET)
        with pytest.raises((NatsClientError, TimeoutError)):
            await kv.put("devices", b'{"serial": 1000, "credentials": []}')
        with pytest.raises((NatsClientError, TimeoutError)):
            await js.purge_stream(f"KV_{REVOCATIONS_BUCKET}")
    finally:
        await agent.close()
