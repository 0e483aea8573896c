"""Containers on this machine with podman: the settings it needs here, and the commands
spanflow's image, Compose and Kubernetes tests run (docs/deploy.md).

Every call gets one ``containers.conf`` (``CONTAINERS_CONF``) that spanflow writes: runc
with cgroupfs and no default ulimits, which works in a sandbox that refuses setrlimit
and hybrid cgroups as well as on an ordinary host. ``podman compose``, ``podman kube
play`` and ``podman build`` all read it, so none needs flags of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from spanflow.errors import SpanflowError

CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""

HOW_TO_INSTALL = "install podman, runc and debootstrap (apt-get install podman runc debootstrap)"


class PodmanError(SpanflowError):
    code = "podman"


def why_not() -> str | None:
    """Why containers cannot be built or run here (None: they can)."""
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found: {HOW_TO_INSTALL}"
    return None


class Podman:
    """``podman`` with spanflow's settings, its configuration under ``work``."""

    def __init__(self, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.conf = work / "containers.conf"
        self.conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 1800.0, capture: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``podman ARGS``; PodmanError with its output when it fails and ``check``."""
        return self.command(["podman", *args], check=check, timeout=timeout, capture=capture)

    def command(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float = 1800.0,
        capture: bool = True,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Any command (``podman-compose``, ``debootstrap``) with these settings."""
        done = subprocess.run(
            list(argv),
            env=self.env,
            capture_output=capture,
            text=True,
            timeout=timeout,
            check=False,
            cwd=cwd,
        )
        if check and done.returncode != 0:
            said = ((done.stdout or "") + (done.stderr or "")).strip()[-3000:]
            raise PodmanError(f"{' '.join(argv[:4])} … failed ({done.returncode}):\n{said}")
        return done

    def has_image(self, name: str) -> bool:
        return self("image", "exists", name, check=False).returncode == 0
