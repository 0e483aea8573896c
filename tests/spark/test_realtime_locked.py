"""Real-Time Mode against a locked NATS server: the JVM source and sink connect over
TLS with a node's own bundle (its certificate and password, user ``agent.rt``, replies
on its own inbox), and give the same results as on an open server; with another
deployment's secrets they fail with the door and the cause."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from spanflow.nats.server import EmbeddedNats
from spanflow.security.secrets import ROLE_ENV, SECRETS_ENV, Secrets
from spanflow.spark.connectors.jetstream import realtime
from tests.helpers import publish, read_all, wait_for
from tests.spark.test_realtime import _payloads, _pipeline, _records, _runner


@pytest.fixture
def locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Secrets]]:
    full = Secrets(tmp_path / "full")
    full.init()
    full.export(tmp_path / "secrets", "agent", node="rt")  # before the server: it admits rt
    secrets = Secrets(tmp_path / "secrets")
    monkeypatch.setenv(SECRETS_ENV, str(secrets.root))
    monkeypatch.setenv(ROLE_ENV, "agent")
    with EmbeddedNats(tmp_path / "nats", secrets=full) as server:
        yield server.url, secrets


def test_realtime_runs_over_tls_with_credentials(spark, locked, uid, tmp_path):
    url, _ = locked
    n = 300
    publish(url, f"IN_{uid}", f"in{uid}.x", _records(0, n))
    real = _runner(spark, _pipeline(uid, "lk", "realtime"), url, tmp_path / "rt")
    real.start()
    try:
        expected = sum(1 for i in range(n) if i % 40 >= 20)
        wait_for(lambda: len(read_all(url, f"ALERTS_lk_{uid}")) >= expected, 90)
        wait_for(lambda: len(read_all(url, f"TOTALS_lk_{uid}")) >= n, 90)
        assert all(s.active and s.error is None for s in real.status())
    finally:
        real.stop()
    alerts = _payloads(url, f"ALERTS_lk_{uid}")
    assert sorted(r["id"] for r in alerts) == [i for i in range(n) if i % 40 >= 20]


def _jvm_connect(spark, url: str) -> str:
    """Connect the JVM client as a real-time query would; its error, or 'connected'."""
    from py4j.protocol import Py4JJavaError

    realtime.share_identity(spark)
    try:
        client = spark._jvm.dev.spanflow.realtime.NatsClient.connect(url, "probe")
    except Py4JJavaError as exc:
        return str(exc.java_exception.getMessage())
    client.close()
    return "connected"


def _jvm_inbox(spark, url: str) -> str:
    """A fresh inbox of the JVM client's connection."""
    realtime.share_identity(spark)
    client = spark._jvm.dev.spanflow.realtime.NatsClient.connect(url, "probe")
    try:
        return str(client.newInbox())
    finally:
        client.close()


def test_the_jvm_client_refuses_foreign_or_wrong_secrets_naming_the_door(
    spark, locked, tmp_path, monkeypatch
):
    url, secrets = locked
    assert _jvm_connect(spark, url) == "connected"
    assert _jvm_inbox(spark, url).startswith("_INBOX_NODE.rt.")
    foreign = Secrets(tmp_path / "foreign")
    foreign.init()
    monkeypatch.setenv(SECRETS_ENV, str(foreign.root))  # trusts another CA
    message = _jvm_connect(spark, url)
    assert "refused TLS for user agent" in message and "127.0.0.1" in message, message
    wrong = Secrets(tmp_path / "wrong")
    shutil.copytree(secrets.root, wrong.root)
    creds = json.loads(wrong.credentials_file.read_text())
    creds["nats"]["agent"] = "guess"
    wrong.credentials_file.write_text(json.dumps(creds))
    monkeypatch.setenv(SECRETS_ENV, str(wrong.root))
    message = _jvm_connect(spark, url)
    assert "refused user agent.rt" in message and "Authorization Violation" in message, message
    assert "guess" not in message
    monkeypatch.delenv(SECRETS_ENV)
    assert "requires TLS" in _jvm_connect(spark, url)


def test_the_jvm_client_checks_the_name_it_was_given_not_the_address(spark, tmp_path, monkeypatch):
    """A server whose certificate names a host, not its address (a container's): the
    JVM client dials the name and checks the certificate against it (jnats would resolve
    it to an address first, and the check would fail)."""
    from spanflow.security import pki

    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    named = pki.issue(
        secrets.ca(), "spanflow server", hosts=("localhost",), server=True, client=True
    )
    secrets.server_cert.write_bytes(named.cert_pem)
    secrets.server_key.write_bytes(named.key_pem)
    assert "127.0.0.1" not in pki.describe(secrets.server_cert).hosts
    monkeypatch.setenv(SECRETS_ENV, str(secrets.root))
    monkeypatch.setenv(ROLE_ENV, "agent")
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:
        port = server.url.rpartition(":")[2]
        assert _jvm_connect(spark, f"tls://localhost:{port}") == "connected"
        refused = _jvm_connect(spark, f"tls://127.0.0.1:{port}")  # not the name it has
        assert "refused TLS" in refused, refused
