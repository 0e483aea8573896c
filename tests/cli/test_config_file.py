"""One configuration file per host: every option of every command from the file or
the environment, the command line winning; a wrong key named with a suggestion; the
documented table is the one the code generates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer.main

from spanflow.cli import app, config
from spanflow.security import pki
from spanflow.security.secrets import Secrets

ROOT = Path(__file__).resolve().parents[2]


def _spanflow(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPANFLOW_")}
    return subprocess.run(
        [sys.executable, "-m", "spanflow.cli", *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=60,
        check=False,
    )


def test_the_file_the_environment_and_the_command_line_in_that_order(tmp_path: Path) -> None:
    conf = tmp_path / "spanflow.yaml"
    conf.write_text(
        f"secrets:\n  init:\n    data-dir: {tmp_path / 'from-file'}\n    host: [file.example]\n"
    )
    done = _spanflow("secrets", "init", env={"SPANFLOW_CONFIG": str(conf)})
    assert done.returncode == 0, done.stderr
    cert = Secrets(tmp_path / "from-file" / "secrets").server_cert
    assert "file.example" in pki.describe(cert).hosts

    env = {"SPANFLOW_CONFIG": str(conf), "SPANFLOW_SECRETS_INIT_DATA_DIR": str(tmp_path / "env")}
    assert _spanflow("secrets", "init", env=env).returncode == 0
    assert Secrets(tmp_path / "env" / "secrets").exists()

    flag = ["--data-dir", str(tmp_path / "flag")]
    assert _spanflow("secrets", "init", *flag, env=env).returncode == 0
    assert Secrets(tmp_path / "flag" / "secrets").exists()


def test_a_wrong_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    conf = tmp_path / "spanflow.yaml"
    conf.write_text("node:\n  gossip-bnd: 10.0.0.1\n")
    done = _spanflow("config", env={"SPANFLOW_CONFIG": str(conf)})
    assert done.returncode == 2
    assert "node.gossip-bnd: no such option (did you mean 'gossip-bind'?)" in done.stderr
    conf.write_text("nod: {}\n")
    done = _spanflow("config", env={"SPANFLOW_CONFIG": str(conf)})
    assert "nod: no such command (did you mean 'node'?)" in done.stderr


def test_docs_list_every_key_with_its_default() -> None:
    table = config.table(typer.main.get_command(app))
    assert "| `node.gossip-bind` | `SPANFLOW_NODE_GOSSIP_BIND` | `127.0.0.1` |" in table
    assert "`site-server.listen` | `SPANFLOW_SITE_SERVER_LISTEN`" in table
    docs = (ROOT / "docs" / "configuration.md").read_text()
    assert table in docs, "docs/configuration.md is stale: regenerate it with `spanflow config`"
