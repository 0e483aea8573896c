"""Fault points: named places in the code where a test can stop a process at an exact
moment — inside an open Kafka transaction, say — and kill it there, instead of hoping
a kill lands at the right time.

A fault point does nothing unless the environment variable ``SPANFLOW_FAULT_DIR``
names a folder holding ``<point>.arm``. Then, the first time the point is passed, it
removes that file (each arming fires once), runs its ``prepare`` step (e.g. flush what
is buffered, so the broker holds it), writes ``<point>.reached`` and waits until the
process is killed or ``<point>.release`` appears. Only whoever controls a process's
environment and that folder can arm it: an operator's test hook, not a remote one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

FAULT_DIR_ENV = "SPANFLOW_FAULT_DIR"


def pause_here(point: str, prepare: Callable[[], object] | None = None) -> None:
    """Hold the process at ``point`` when a test armed it (see the module's docstring)."""
    folder = os.environ.get(FAULT_DIR_ENV)
    if not folder:
        return
    armed = Path(folder) / f"{point}.arm"
    try:
        armed.unlink()
    except FileNotFoundError:
        return
    if prepare is not None:
        prepare()
    (Path(folder) / f"{point}.reached").write_text(str(os.getpid()))
    release = Path(folder) / f"{point}.release"
    while not release.exists():
        time.sleep(0.05)
    release.unlink(missing_ok=True)
