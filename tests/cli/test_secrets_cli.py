"""``spanflow secrets``: init, show, device and a full gossip-key rotation, without a
secret ever printed (except a new device's password, once)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from spanflow.cli import app
from spanflow.cli.secrets import key_id
from spanflow.security.secrets import Secrets

runner = CliRunner()


def _run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_init_show_device_and_rotate_the_gossip_key(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path)]
    out = _run("secrets", "init", "--host", "hub.example", *data)
    assert "credentials.json" in out and "gossip.keyring" in out
    secrets = Secrets(tmp_path / "secrets")
    creds = secrets.credentials()
    old = key_id(secrets.keyring().primary)
    shown = _run("secrets", "show", *data)
    assert "hub.example" in shown and f"{old} (primary)" in shown
    for secret in [*creds.passwords.values(), creds.rest_token]:
        assert secret not in shown
    assert "complete, nothing to write" in _run("secrets", "init", *data)

    out = _run("secrets", "device", "press-7", "--publish", "sensors.press-7.>", *data)
    password = secrets.device_identity("press-7").password
    assert password in out and "shown once" in out
    assert password not in _run("secrets", "show", *data)

    _run("secrets", "gossip-key", "new", *data)
    ring = secrets.keyring()
    assert len(ring.keys) == 2 and key_id(ring.primary) == old
    new = key_id(ring.keys[1])
    _run("secrets", "gossip-key", "use", new, *data)
    assert key_id(secrets.keyring().primary) == new
    _run("secrets", "gossip-key", "remove", old, *data)
    assert [key_id(k) for k in secrets.keyring().keys] == [new]
    refused = runner.invoke(app, ["secrets", "gossip-key", "remove", "nope", *data])
    assert refused.exit_code != 0 and "no key 'nope'" in refused.output


def test_doors_beyond_loopback_refuse_to_open_without_a_lock(tmp_path: Path) -> None:
    """Without secrets or a token, a coordinator or a site server asked to listen on the
    network refuses to start, saying what to do."""
    data = ["--data-dir", str(tmp_path)]
    coordinator = runner.invoke(app, ["coordinator", "--host", "0.0.0.0", "--port", "0", *data])
    assert coordinator.exit_code == 2
    assert "REST API on 0.0.0.0 would answer anyone" in coordinator.output
    site = runner.invoke(app, ["site-server", "--site", "s1", "--listen", "0.0.0.0:0", *data])
    assert site.exit_code == 2 and "spanflow secrets init" in site.output
    mqtt = ["--listen", "127.0.0.1:0", "--mqtt-listen", "0.0.0.0:0"]
    site = runner.invoke(app, ["site-server", "--site", "s1", *mqtt, *data])
    assert site.exit_code == 2 and "beyond loopback without TLS" in site.output
    example = str(Path(__file__).parents[2] / "examples" / "sensor_alerts.yaml")
    run = runner.invoke(app, ["run", example, "--mqtt-listen", "0.0.0.0:0", *data])
    assert run.exit_code == 2 and "MQTT on 0.0.0.0 would take readings from anyone" in run.output


def test_the_hosts_demo_refuses_a_cut_it_cannot_make() -> None:
    result = runner.invoke(app, ["demo", "--hosts", "--cut", "factory-z:30"])
    assert result.exit_code == 2 and "expected SITE:SECONDS" in result.output
