"""Jars from Maven Central, fetched once with ``mvn`` and reused: the classpath of a
set of artifacts (with their dependencies).

What spanflow runs on the JVM beyond PySpark's own jars comes from Maven Central:
Apache Kafka's broker for tests and examples (``spanflow.local.kafka_broker``), the
NATS Java client (jnats), Spark's Kafka connector and Hadoop's S3A file system
(``spanflow.spark.jvm.jars``). Nothing is
downloaded from anywhere else. Maven keeps the jars in its own local repository
(``~/.m2/repository``); spanflow keeps the resolved classpath of each set in
``$SPANFLOW_MAVEN_CACHE`` (default ``~/.cache/spanflow/maven``), so a set whose jars are
all present is used without starting Maven at all.

Resolving a set the first time takes a few seconds to a minute (the download); two
processes resolving the same set at once wait for each other (a file lock).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from spanflow.errors import SpanflowError


class MavenError(SpanflowError):
    code = "maven"


@dataclass(frozen=True)
class Artifacts:
    """A named set of Maven coordinates (``group:artifact:version``), resolved together."""

    name: str
    coordinates: tuple[str, ...]
    excludes: tuple[str, ...] = ()
    """``group:artifact`` left out of the classpath (what the JVM that uses it has)."""

    @property
    def key(self) -> str:
        text = "\n".join((*self.coordinates, "--", *self.excludes))
        return f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def cache_dir() -> Path:
    return Path(os.environ.get("SPANFLOW_MAVEN_CACHE", Path.home() / ".cache/spanflow/maven"))


def classpath(artifacts: Artifacts) -> list[Path]:
    """The jars of ``artifacts`` and their runtime dependencies, fetched if missing."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    recorded = folder / f"{artifacts.key}.classpath"
    cached = _read(recorded)
    if cached is not None:
        return cached
    with open(folder / f"{artifacts.key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be resolving it
        cached = _read(recorded)
        if cached is not None:
            return cached
        jars = _resolve(artifacts)
        tmp = recorded.with_suffix(".tmp")
        tmp.write_text("\n".join(str(j) for j in jars) + "\n")
        tmp.replace(recorded)
        return jars


def _read(recorded: Path) -> list[Path] | None:
    """A recorded classpath whose jars are all still there (None: resolve again)."""
    try:
        jars = [Path(line) for line in recorded.read_text().splitlines() if line]
    except OSError:
        return None
    return jars if jars and all(j.is_file() for j in jars) else None


def mvn_binary() -> str:
    found = os.environ.get("SPANFLOW_MVN") or shutil.which("mvn")
    if not found:
        raise MavenError(
            "Maven (mvn) is needed once to fetch jars from Maven Central: install it "
            "(apt-get install maven, or https://maven.apache.org) and try again"
        )
    return found


def _resolve(artifacts: Artifacts) -> list[Path]:
    with tempfile.TemporaryDirectory(prefix="spanflow-maven-") as tmp:
        pom, out = Path(tmp) / "pom.xml", Path(tmp) / "classpath.txt"
        pom.write_text(_pom(artifacts))
        args = [mvn_binary(), "-B", "-q", "-f", str(pom), "dependency:build-classpath",
                f"-Dmdep.outputFile={out}", "-Dmdep.includeScope=runtime"]  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not out.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
            raise MavenError(
                f"could not fetch {artifacts.name} ({', '.join(artifacts.coordinates)}) "
                "from Maven Central:\n" + "\n".join(tail)
            )
        return [Path(p) for p in out.read_text().strip().split(os.pathsep) if p]


def _pom(artifacts: Artifacts) -> str:
    deps = "".join(_dependency(c, artifacts.excludes) for c in artifacts.coordinates)
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">'
        "<modelVersion>4.0.0</modelVersion><groupId>spanflow.fetch</groupId>"
        f"<artifactId>{escape(artifacts.name)}</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{deps}</dependencies></project>"
    )


def _dependency(coordinate: str, excludes: Sequence[str]) -> str:
    group, artifact, version = coordinate.split(":")
    skip = "".join(
        f"<exclusion><groupId>{escape(g)}</groupId><artifactId>{escape(a)}</artifactId></exclusion>"
        for g, a in (e.split(":") for e in excludes)
    )
    return (
        f"<dependency><groupId>{escape(group)}</groupId><artifactId>{escape(artifact)}"
        f"</artifactId><version>{escape(version)}</version>"
        f"<exclusions>{skip}</exclusions></dependency>"
    )
