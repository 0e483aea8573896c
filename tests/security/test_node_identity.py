"""Every node its own NATS identity. A node's bundle (``secrets export --role agent``)
logs in as ``agent.<node>`` with a certificate naming that user, gets its replies on
``_INBOX_NODE.<node>``, and holds no other node's password and not the shared agent
role's. Run from the real bundles against a real server, with nats-py driven by hand:
node a1's host can neither read nor answer a2's replies (not even through ``>``), nor
publish a2's heartbeats or activity reports; its own requests are answered; the
shared ``agent`` role can read no node's replies; another node's bundle is refused;
a revoked node is cut off at the servers' reload, at sites holding an older bundle once
the list reaches them, and at the REST API at once."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from spanflow.errors import SecurityError
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.security.environment import revoked_nodes_from_env
from spanflow.security.secrets import SECRETS_ENV, Secrets, node_token
from spanflow.server.principals import authenticator

MINE = "_INBOX_NODE.a1."
SPY_ON = (">", "_INBOX_NODE.>", "_INBOX_NODE.a2.>", "_INBOX.>", "spanflow.>")


@pytest.fixture
def full(tmp_path: Path) -> Secrets:
    found = Secrets(tmp_path / "full")
    found.init()
    return found


def _bundle(full: Secrets, tmp_path: Path, node: str) -> Secrets:
    full.export(tmp_path / node, "agent", node=node)
    return Secrets(tmp_path / node)


def test_a_nodes_bundle_holds_its_own_login_and_no_other(full: Secrets, tmp_path: Path) -> None:
    a1 = _bundle(full, tmp_path, "a1")
    _bundle(full, tmp_path, "a2")
    held = json.loads(a1.credentials_file.read_text())
    creds = full.credentials()
    assert held["node"] == "a1" and set(held["nats"]) == {"agent"}
    assert creds.nodes == {"a1": None, "a2": None}
    text = "\n".join(p.read_text() for p in a1.root.rglob("*") if p.is_file())
    assert creds.passwords["agent"] not in text  # the shared role's
    assert creds.node_password_for("a2") not in text  # another node's
    identity = a1.identity("agent")
    assert (identity.user, identity.inbox_prefix) == ("agent.a1", "_INBOX_NODE.a1")
    with pytest.raises(SecurityError, match="one token"):
        full.export(tmp_path / "bad", "agent", node="a.b")


def test_a_nodes_host_reads_and_answers_no_other_nodes_replies(
    full: Secrets, tmp_path: Path
) -> None:
    a1, a2 = _bundle(full, tmp_path, "a1"), _bundle(full, tmp_path, "a2")
    with EmbeddedNats(tmp_path / "nats", secrets=full) as server:
        asyncio.run(_replies(server.url, full, a1, a2))


async def _spy(nc: Client, subjects: tuple[str, ...]) -> list[str]:
    seen: list[str] = []

    async def note(msg: Msg) -> None:
        seen.append(msg.subject)

    for subject in subjects:
        await nc.subscribe(subject, cb=note)
    await nc.flush()
    return seen


async def _replies(url: str, full: Secrets, a1: Secrets, a2: Secrets) -> None:
    thief = await connect(url, identity=a1.identity("agent"))
    victim = await connect(url, identity=a2.identity("agent"))
    shared = await connect(url, identity=full.identity("agent"))  # a full directory's agent
    stolen = await _spy(thief, SPY_ON)
    shared_saw = await _spy(shared, (">", "_INBOX_NODE.>"))
    js = victim.jetstream()
    await js.add_stream(name="PLANT", subjects=["plant.>"])
    await js.publish("plant.a", b"1")  # acked on a2's inbox
    assert (await js.stream_info("PLANT")).state.messages == 1
    assert (await thief.jetstream().stream_info("PLANT")).state.messages == 1  # a1's own
    await asyncio.sleep(0.3)  # deliveries to the spies would be in by now
    theirs = [s for s in stolen if s.startswith("_INBOX") and not s.startswith(MINE)]
    assert theirs == [], theirs
    assert any(s.startswith(MINE) for s in stolen)  # a1's own replies do come
    assert [s for s in shared_saw if s.startswith("_INBOX")] == []
    assert "plant.a" in stolen  # the spy hears what agents may read

    answered = await _spy(victim, ("_INBOX_NODE.a2.pending.*",))
    await thief.publish("_INBOX_NODE.a2.pending.1", b"forged")
    await thief.flush()
    await victim.publish("_INBOX_NODE.a2.pending.2", b"genuine")
    await victim.flush()
    await _until(lambda: bool(answered), "the genuine answer never came")
    await asyncio.sleep(0.3)
    assert answered == ["_INBOX_NODE.a2.pending.2"]
    for nc in (thief, victim, shared):
        await nc.close()


def test_a_nodes_host_publishes_no_other_nodes_heartbeat_or_activity(
    full: Secrets, tmp_path: Path
) -> None:
    a1 = _bundle(full, tmp_path, "a1")
    _bundle(full, tmp_path, "a2")
    with EmbeddedNats(tmp_path / "nats", secrets=full) as server:
        asyncio.run(_reports(server.url, full, a1))


async def _reports(url: str, full: Secrets, a1: Secrets) -> None:
    coordinator = await connect(url, identity=full.identity("coordinator"))
    heard = await _spy(coordinator, ("spanflow.heartbeat.*", "spanflow.activity.>"))
    thief = await connect(url, identity=a1.identity("agent"))
    for subject in ("spanflow.heartbeat.a2", "spanflow.activity.a2.p-f0.failed"):
        await thief.publish(subject, b"{}")
    await thief.publish("spanflow.heartbeat.a1", b"{}")  # its own, last
    await thief.flush()
    await _until(lambda: "spanflow.heartbeat.a1" in heard, "a1's own heartbeat never came")
    assert heard == ["spanflow.heartbeat.a1"]
    # a2's password with a1's certificate: the certificate names the user
    creds = json.loads(a1.credentials_file.read_text())
    creds["nats"]["agent"] = full.credentials().node_password_for("a2")
    a1.credentials_file.write_text(json.dumps(creds))
    with pytest.raises(SecurityError):
        await connect(url, identity=a1.identity("agent"))
    for nc in (coordinator, thief):
        await nc.close()


async def _until(check: object, why: str, within: float = 10.0) -> None:
    assert callable(check)
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, why
        await asyncio.sleep(0.05)


def test_another_sites_node_reads_no_replies_across_the_leaf_link(
    full: Secrets, tmp_path: Path
) -> None:
    """Node c1 at the hub asks site factory's JetStream domain across the leaf link and
    gets its answers; node e1's host at factory, subscribed to c1's inbox on its own
    site server, gets none of them (that server's bundle, made after c1's, denies it
    by name)."""
    e1, c1 = Secrets(tmp_path / "e1"), Secrets(tmp_path / "c1")
    full.export(e1.root, "agent", node="e1", site="factory")
    full.export(c1.root, "agent", node="c1", site="cloud")
    full.export(tmp_path / "site", "site", site="factory")
    with EmbeddedNats(
        tmp_path / "hub", name="hub", domain="hub", leaf_listen=True, secrets=full,
        leaf_sites=("factory",),
    ) as hub, EmbeddedNats(
        tmp_path / "factory", name="factory", domain="factory", leaf_remote=hub.leaf_url,
        secrets=Secrets(tmp_path / "site"),
    ) as site:  # fmt: skip
        asyncio.run(_across(hub.url, site.url, e1, c1))


async def _across(hub_url: str, site_url: str, e1: Secrets, c1: Secrets) -> None:
    thief = await connect(site_url, identity=e1.identity("agent"))
    stolen = await _spy(thief, (">", "_INBOX_NODE.c1.>"))
    victim = await connect(hub_url, identity=c1.identity("agent"))
    deadline = asyncio.get_running_loop().time() + 20
    answers = 0
    while answers < 5:  # the first ones may fall before the leaf link is up
        assert asyncio.get_running_loop().time() < deadline, "factory's domain never answered"
        try:
            await victim.request("$JS.factory.API.INFO", b"", timeout=1.0)
            answers += 1
        except TimeoutError:
            continue
    await asyncio.sleep(0.3)  # deliveries to the spy would be in by now
    assert [s for s in stolen if s.startswith("_INBOX_NODE.c1.")] == []
    for nc in (thief, victim):
        await nc.close()


def test_a_revoked_node_is_cut_off_everywhere_and_its_name_not_reused(
    full: Secrets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a1 = Secrets(tmp_path / "a1")
    full.export(a1.root, "agent", node="a1", site="factory")
    a2 = _bundle(full, tmp_path, "a2")
    full.export(tmp_path / "site", "site", site="factory")  # made before the revocation
    full.export(tmp_path / "hub", "coordinator")
    site, hub = Secrets(tmp_path / "site"), Secrets(tmp_path / "hub")
    with EmbeddedNats(tmp_path / "nats", secrets=full) as server:
        asyncio.run(_revoked_at_reload(server, full, a1, a2))
    assert set(site.credentials().node_passwords) == {"a1", "a2"}
    assert site.store_revocations(full.revocations_file.read_bytes())  # pushed to the site
    assert set(site.credentials().node_passwords) == {"a2"}
    assert set(hub.credentials().nodes) == {"a1", "a2"}  # a hub's bundle from before
    shutil.copy(full.revocations_file, hub.revocations_file)  # the list copied there
    assert set(hub.credentials().nodes) == {"a2"}
    monkeypatch.setenv(SECRETS_ENV, str(full.root))
    key = full.credentials().agent_key or ""
    authenticate = authenticator("operator-token", key, revoked_nodes_from_env())
    assert authenticate(node_token(key, "a1")) is None
    assert authenticate(node_token(key, "a2")) == "node:a2"
    with pytest.raises(SecurityError, match="was revoked"):
        full.export(tmp_path / "again", "agent", node="a1")


async def _revoked_at_reload(server: EmbeddedNats, full: Secrets, a1: Secrets, a2: Secrets) -> None:
    gone = await connect(server.url, identity=a1.identity("agent"))
    kept = await connect(server.url, identity=a2.identity("agent"))
    full.revoke_node("a1")
    await asyncio.to_thread(server.reload)
    await _until(lambda: not gone.is_connected, "the revoked node's session stayed open")
    with pytest.raises(SecurityError):
        await connect(server.url, identity=a1.identity("agent"))
    assert kept.is_connected
    await kept.close()
    await gone.close()
