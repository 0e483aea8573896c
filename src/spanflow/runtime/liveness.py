"""A file whose age says a process's main loop still turns: what a container's health
check reads for a role that serves no HTTP: a node agent renews ``<state dir>/<node>.alive``
(``spanflow probe --file``).

A stuck loop (a Spark call that never returns, a dead lock) stops renewing it; a
process that merely waits on a slow network keeps it fresh. Written at most once per
``every`` seconds (the loop may turn many times a second).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


class Liveness:
    def __init__(self, path: Path, every: float = 2.0) -> None:
        self.path = path
        self.every = every
        self._last = float("-inf")

    def beat(self) -> None:
        """Renew the file (its modification time) if ``every`` seconds have passed."""
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        except OSError:
            pass  # a full or read-only disk must not stop the agent; the probe then says so


def age(path: Path) -> float | None:
    """Seconds since ``path`` was last renewed (None: it does not exist)."""
    try:
        return max(0.0, time.time() - os.stat(path).st_mtime)
    except OSError:
        return None
