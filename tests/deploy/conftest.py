"""The image every deployment test runs: built once per test run from this clone (its
Debian base cached under the data directory), its build time printed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spanflow.local.image import build
from spanflow.local.podman import Podman, why_not
from spanflow.nats.server import default_data_dir


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    reason = why_not()
    assert reason is None, reason
    return Podman(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="session")
def image(podman: Podman) -> Iterator[str]:
    given = os.environ.get("SPANFLOW_TEST_IMAGE")  # while working on the tests only
    if given:
        yield given
        return
    started = time.monotonic()
    name = build(lambda said: print(f"[image] {said}", flush=True), data_dir=default_data_dir())
    print(f"[image] {name}: {time.monotonic() - started:.0f} s to build", flush=True)
    yield name


def volume_path(podman: Podman, volume: str) -> Path:
    """Where a named volume's files are on this machine."""
    done = podman("volume", "inspect", volume, "--format", "{{.Mountpoint}}")
    return Path(done.stdout.strip())
