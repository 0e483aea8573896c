"""`spanflow probe`, a container's health check: a file its loop renews, or a URL."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from typer.testing import CliRunner

from spanflow.cli import app
from spanflow.local.server import free_port
from spanflow.runtime.liveness import Liveness

runner = CliRunner()


def test_a_renewed_file_is_healthy_and_a_stale_or_missing_one_is_not(tmp_path: Path) -> None:
    alive = tmp_path / "agents" / "n1.alive"
    missing = runner.invoke(app, ["probe", f"file:{alive}"])
    assert missing.exit_code == 1 and "does not exist" in missing.output
    Liveness(alive).beat()
    assert runner.invoke(app, ["probe", f"file:{alive}"]).exit_code == 0
    old = time.time() - 120
    os.utime(alive, (old, old))  # a loop stuck for two minutes
    stale = runner.invoke(app, ["probe", f"file:{alive}", "--max-age", "30"])
    # 120 s, or a second or two more on a busy machine
    assert stale.exit_code == 1 and re.search(r"not renewed for 12[0-9] s", stale.output)


def test_a_url_that_does_not_answer_is_unhealthy_and_nothing_to_probe_says_so() -> None:
    refused = runner.invoke(app, ["probe", f"http://127.0.0.1:{free_port()}/healthz"])
    assert refused.exit_code == 1 and "unhealthy" in refused.output
    nothing = runner.invoke(app, ["probe"], env={"SPANFLOW_PROBE": ""})
    assert nothing.exit_code == 1 and "SPANFLOW_PROBE" in nothing.output
