"""Find a JVM for PySpark: the system's Java 17+, else the shim ``scripts/bootstrap.py`` made."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from spanflow.errors import SpanflowError


def ensure_java_home() -> None:
    """Set JAVA_HOME when Java is not already reachable, or explain how to get one."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    shim = Path(sys.prefix) / "java-home"
    if (shim / "bin" / "java").exists():
        os.environ["JAVA_HOME"] = str(shim)
        return
    raise SpanflowError(
        "no Java found: PySpark needs Java 17+. Install one (e.g. apt-get install "
        "openjdk-17-jre-headless) or run ./dev, which sets up a bundled JVM."
    )
