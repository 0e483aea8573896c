"""HTTPS for the REST API: a locked coordinator serves it with the deployment's
certificate (beyond loopback always; ``--tls`` on loopback), a client that trusts the
deployment's CA gets in, one that does not is refused, plain HTTP gets nothing, and a
coordinator asked to take a token in clear beyond loopback refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from spanflow.cli import app
from spanflow.protocol.client import CoordinatorClient
from spanflow.security.https import client_context
from spanflow.security.secrets import Secrets


def test_a_locked_coordinator_serves_https_to_clients_that_trust_the_ca(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    port_file, log = tmp_path / "port", tmp_path / "coordinator.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPANFLOW_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spanflow.cli", "coordinator", "--tls", "--port", "0",
             "--port-file", str(port_file), "--data-dir", str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        port = int(port_file.read_text())
        url = f"https://127.0.0.1:{port}"
        ca = client_context(secrets)
        token = secrets.credentials().rest_token
        client = CoordinatorClient(url, token, patience=60, verify=ca)
        assert client.health().ok
        assert client.nodes() == []
        try:  # a client of another deployment (or none) does not trust the certificate
            httpx.get(f"{url}/healthz", timeout=5)
            raise AssertionError("a client without the deployment's CA got in")
        except httpx.ConnectError as exc:
            assert "CERTIFICATE_VERIFY_FAILED" in str(exc)
        try:  # plain HTTP to the HTTPS port: no answer a client could mistake
            status = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code
        except httpx.HTTPError:
            status = 0
        assert status in (0, 400)
        assert f"coordinator on {url}" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_token_in_clear_beyond_loopback_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["coordinator", "--host", "0.0.0.0", "--port", "0", "--token", "t0k3n",
         "--data-dir", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "bearer token in clear over the network" in result.output
    assert "t0k3n" not in result.output
