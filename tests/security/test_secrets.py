"""The secrets directory, the CA and the gossip keyring (pure: no servers)."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest

from spanflow.errors import SecurityError
from spanflow.security import pki
from spanflow.security.keyring import OVERHEAD, Keyring, SealError, decode_key, new_key
from spanflow.security.nats_config import redact_url, role_permissions, users, with_userinfo
from spanflow.security.secrets import ROLES, Secrets


def test_init_writes_every_file_owner_only_and_is_idempotent(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path / "secrets")
    written = secrets.init(hosts=("hub.example", "10.0.0.5"))
    assert secrets.exists() and secrets.credentials_file in written
    for path in secrets.root.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert stat.S_IMODE(secrets.root.stat().st_mode) == 0o700
    before = secrets.credentials()
    assert set(before.passwords) == set(ROLES) and len(set(before.passwords.values())) == len(ROLES)
    assert secrets.init() == []  # nothing missing: nothing rewritten
    info = pki.describe(secrets.server_cert)
    assert {"hub.example", "10.0.0.5", "127.0.0.1", "localhost"} <= set(info.hosts)
    renewed = secrets.init(hosts=("other.example",), renew=True)
    assert secrets.server_cert in renewed and secrets.credentials() == before
    assert "other.example" in pki.describe(secrets.server_cert).hosts
    assert pki.describe(secrets.server_cert).fingerprint != info.fingerprint


def test_identities_and_devices(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path)
    secrets.init()
    agent = secrets.identity("agent")
    assert agent.user == "agent" and agent.password not in repr(agent)
    assert agent.connect_options()["tls"] is not None
    with pytest.raises(SecurityError, match="unknown role 'admin'"):
        secrets.identity("admin")
    password = secrets.add_device("press-7", ("sensors.press-7.>",))
    assert secrets.device_identity("press-7").password == password
    with pytest.raises(SecurityError, match="one token"):
        secrets.add_device("a.b", ("x",))
    with pytest.raises(SecurityError, match="no device 'press-8'"):
        secrets.device_identity("press-8")
    user = next(u for u in users(secrets.credentials()) if u["user"] == "press-7")
    assert user["permissions"]["publish"] == {"allow": ["sensors.press-7.>"]}


def test_missing_or_corrupt_credentials_name_the_file(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path)
    with pytest.raises(SecurityError, match="spanflow secrets init"):
        secrets.credentials()
    secrets.init()
    secrets.credentials_file.write_text("{not json")
    with pytest.raises(SecurityError, match=r"credentials\.json is not a spanflow credentials"):
        secrets.identity("agent")


def test_role_permissions_keep_agents_off_the_control_log() -> None:
    agent = role_permissions("agent")
    assert agent is not None
    denied = agent["publish"]["deny"]
    assert "spanflow.wal.>" in denied and "$JS.API.STREAM.PURGE.SPANFLOW_WAL" in denied
    assert role_permissions("coordinator") is None
    reader = role_permissions("reader")
    assert reader is not None and "$JS.API.CONSUMER.CREATE.*" in reader["publish"]["allow"]
    assert not any("DELETE" in s for s in reader["publish"]["allow"])


def test_urls_carry_credentials_but_logs_do_not() -> None:
    url = with_userinfo("nats-leaf://hub:7422", "leaf", "s3cr:t")
    assert url == "nats-leaf://leaf:s3cr%3At@hub:7422"
    assert "s3cr" not in redact_url(url) and "hub:7422" in redact_url(url)


def test_certificate_expiry_is_visible() -> None:
    ca = pki.create_ca()
    old = pki.issue(
        ca, "agent", client=True, days=1, not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
    )
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(old.cert_pem)
    assert cert.not_valid_after_utc < dt.datetime.now(dt.UTC)


def test_keyring_seals_opens_and_rotates() -> None:
    old, new = new_key(), new_key(16)
    ring = Keyring((old,))
    packet = ring.seal(b"ping")
    assert len(packet) == 4 + OVERHEAD and b"ping" not in packet
    assert ring.seal(b"ping") != packet  # a fresh nonce every time
    rotating = ring.install(new)
    assert rotating.primary == old and rotating.open(packet) == b"ping"
    switched = rotating.use(new)
    assert switched.primary == new and switched.open(packet) == b"ping"  # old still opens
    with pytest.raises(SealError):
        ring.open(switched.seal(b"pong"))  # a node without the new key cannot read it
    done = switched.remove(old)
    with pytest.raises(SealError, match="no key"):
        done.open(packet)
    with pytest.raises(SecurityError, match="primary"):
        done.remove(new)
    tampered = bytearray(done.seal(b"ack"))
    tampered[-1] ^= 1
    with pytest.raises(SealError):
        done.open(bytes(tampered))
    with pytest.raises(SealError, match="not a sealed"):
        done.open(b'[["ping"]]')
    assert Keyring.loads(done.dumps()) == done
    other_label = Keyring((new,), label=b"another-cluster")
    with pytest.raises(SealError):
        other_label.open(done.seal(b"x"))


def test_keyring_files_name_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "gossip.keyring"
    path.write_text("# primary first\n" + "c2hvcnQ=\n")
    with pytest.raises(SecurityError, match=r"line 2: .*16, 24 or 32 bytes, not 5"):
        Keyring.load(path)
    with pytest.raises(SecurityError, match="base64"):
        decode_key("not base64!")


def test_init_closes_an_open_clients_directory_and_refuses_symbolic_links(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path / "secrets")
    (secrets.root / "clients").mkdir(parents=True, mode=0o777)
    (secrets.root / "clients").chmod(0o777)
    secrets.init()
    assert stat.S_IMODE((secrets.root / "clients").stat().st_mode) == 0o700
    elsewhere = tmp_path / "elsewhere.key"
    elsewhere.write_text("")
    victim = Secrets(tmp_path / "victim")
    (victim.root / "clients").mkdir(parents=True)
    (victim.root / "clients" / "agent.key").symlink_to(elsewhere)
    with pytest.raises(SecurityError, match="symbolic link"):
        victim.init()
    assert elsewhere.read_text() == ""  # no key was written through the link
    linked = Secrets(tmp_path / "linked")
    linked.root.symlink_to(tmp_path / "elsewhere-dir", target_is_directory=True)
    with pytest.raises(SecurityError, match="symbolic link"):
        linked.init()
