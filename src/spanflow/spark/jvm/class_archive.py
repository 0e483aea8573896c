"""Spark's classes in a class-data-sharing archive, so a node's Spark starts sooner.

A driver JVM loads, verifies and links ≈20,000 classes before its first micro-batch.
With a CDS archive (the JDK's class data sharing) it maps them from one file instead:
on a 2-core machine the session came up in 4.4 s instead of 6.5 s and its first job
took 1.0 s instead of 2.0 s (docs/benchmarks.md). That is most of the gap between a
restarted node and its first alert.

The archive is made once per machine, JVM and Spark version (``./dev`` makes it after
installing; ``python -m spanflow.spark.jvm.class_archive`` makes it by hand): a child
process starts a session with ``-XX:ArchiveClassesAtExit``, runs a small batch job, a
stateful streaming query and a pandas function, and stops; a second child starts a
session on the new archive to prove it works; only then does it take its final name,
with a note of its size and time. A session uses the archive only when that note
matches the file: a JVM that maps a truncated archive dies of SIGBUS, so a file
changed since is never handed to one. A JVM whose build or class path differs from
the archive's ignores it (silently: the archive's own warnings are turned off).

``SPANFLOW_SPARK_CLASS_ARCHIVE=0`` turns it off.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "SPANFLOW_SPARK_CLASS_ARCHIVE"
PREFIX = "spark-classes-"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""The archive's own warnings (classes it skips, a mismatch) would go to stdout."""


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.exists():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found is not None else None


def archive_key() -> str | None:
    """What the archive depends on: the JVM binary, Spark's jars and the extra class
    path (spanflow.spark.jvm.jars) (None: no JVM)."""
    import pyspark

    from spanflow.spark.jvm.jars import class_path

    java = _java()
    if java is None:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    stat = java.stat()
    parts = [str(java), str(stat.st_size), str(stat.st_mtime_ns), pyspark.__version__]
    parts += sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    parts.append(class_path())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_dir() -> Path:
    """Beside the installation (a virtual environment) when writable, else the user's cache."""
    here = Path(sys.prefix) / "share" / "spanflow"
    with contextlib.suppress(OSError):
        here.mkdir(parents=True, exist_ok=True)
    if os.access(here, os.W_OK):
        return here
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spanflow"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def archive_path() -> Path | None:
    """Where this JVM's and Spark's archive is (or goes): one made beside the
    installation is used even where this user cannot write there (an image's, made at
    build time by root, run by an unprivileged user)."""
    key = archive_key()
    if key is None:
        return None
    name = f"{PREFIX}{key}.jsa"
    installed = Path(sys.prefix) / "share" / "spanflow" / name
    return installed if installed.exists() else archive_dir() / name


def _note(path: Path) -> Path:
    return path.with_suffix(".json")


def _fingerprint(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def usable(path: Path) -> bool:
    """Is ``path`` the archive its note describes (made and checked here, unchanged)?"""
    try:
        note = json.loads(_note(path).read_text())
        return bool(note == _fingerprint(path))
    except (OSError, ValueError):
        return False


def java_options() -> str:
    """JVM options that map the archive, or "" (none made, turned off, or changed)."""
    if not enabled():
        return ""
    path = archive_path()
    if path is None or not usable(path):
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def ensure(timeout: float = 300.0) -> Path | None:
    """The archive for this JVM and Spark, made now when missing (None: it could not be)."""
    path = archive_path()
    if path is None:
        return None
    if usable(path):
        return path
    return create(path, timeout=timeout)


def create(path: Path, *, timeout: float = 300.0) -> Path | None:
    """Dump the classes a warm-up session loads into ``path``, prove the archive works,
    and leave it with its note; old archives in the same directory go."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    try:
        started = time.monotonic()
        if not _child(["--dump", str(tmp)], timeout) or not tmp.exists():
            log.warning("could not make Spark's class archive (sessions start without one)")
            return None
        if not _child(["--check", str(tmp)], timeout):
            log.warning("Spark's class archive failed its check; sessions start without one")
            return None
        os.replace(tmp, path)
        _note(path).write_text(json.dumps(_fingerprint(path)))
        for old in path.parent.glob(f"{PREFIX}*"):
            if old.stem != path.stem:
                old.unlink(missing_ok=True)
        log.info("made %s in %.0f s", path, time.monotonic() - started)
        return path
    finally:
        tmp.unlink(missing_ok=True)


def _child(args: list[str], timeout: float) -> bool:
    cmd = [sys.executable, "-m", "spanflow.spark.jvm.class_archive", *args]
    try:
        done = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, check=False)
    except subprocess.TimeoutExpired:
        return False
    if done.returncode != 0:
        log.info("%s failed (%s): %s", " ".join(args), done.returncode, done.stderr[-2000:])
    return done.returncode == 0


def _warm_up(options: str) -> None:
    """A session with ``options``: the classes a node's first batches load (a batch job,
    a stateful streaming query on RocksDB, Arrow and pandas), then a clean JVM exit."""
    from pyspark.sql import functions as F

    from spanflow.spark.session import DEFAULTS, build_session, rehearse_streaming

    base = DEFAULTS["spark.driver.extraJavaOptions"]
    spark = build_session(conf={"spark.driver.extraJavaOptions": f"{base} {options} {QUIET}"})
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "in"
        data.mkdir()
        (data / "a.json").write_text(
            "\n".join(json.dumps({"k": f"d{i % 5}", "v": i, "ts": i}) for i in range(100))
        )
        spark.range(1000).groupBy((F.col("id") % 7).alias("g")).count().collect()
        df = spark.read.json(str(data))
        df.groupBy("k").applyInPandas(lambda pdf: pdf.head(1), df.schema).collect()
    rehearse_streaming(spark)
    spark.stop()
    _exit_jvm()


def _exit_jvm() -> None:
    """Close the JVM's stdin (it exits on EOF) and wait: it writes the archive as it exits."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return
    gateway.shutdown()
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=240)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    parser.add_argument("--check", help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true", help="say nothing when it exists")
    args = parser.parse_args(argv)
    if args.dump:
        _warm_up(f"-XX:ArchiveClassesAtExit={args.dump}")
        return 0
    if args.check:
        _warm_up(f"-XX:SharedArchiveFile={args.check}")
        return 0
    if not enabled():
        print(f"{ENV}=0: no class archive")
        return 0
    from spanflow.spark.jvm.java import ensure_java_home

    ensure_java_home()
    path = archive_path()
    if path is not None and usable(path):
        if not args.quiet:
            print(f"Spark's class archive: {path}")
        return 0
    print("making Spark's class archive (once per machine and Spark version, ≈45 s)", flush=True)
    made = ensure()
    if made is None:
        print("no class archive: Spark sessions start without one")
        return 1
    print(f"Spark's class archive: {made} ({made.stat().st_size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
