"""The JVM side of Real-Time Mode: where its jar is, what it was built from, how to rebuild it.

The jar (``jvm/spanflow-realtime.jar`` beside this module) ships in the repository,
built from the Java sources beside it, so a fresh clone needs no JDK: only the JVM PySpark needs
anyway. It records the SHA-256 of those sources (``META-INF/spanflow-sources.sha256``);
the tests recompute it, so a jar that does not match its sources fails CI, and where a
``javac`` is at hand they rebuild the jar and compare it class by class.

Rebuild after changing a Java file::

    .venv/bin/python -m spanflow.spark.connectors.jetstream.jvm_jar

It compiles with ``javac --release 17`` against the PySpark wheel's jars and the
official NATS client (``io.nats:jnats``, resolved from Maven Central with ``mvn``; the
sessions load it beside this jar) and writes a reproducible jar (sorted entries, fixed
timestamps).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from spanflow.errors import SpanflowError

JVM_DIR = Path(__file__).parent / "jvm"
JAR = JVM_DIR / "spanflow-realtime.jar"
DIGEST_ENTRY = "META-INF/spanflow-sources.sha256"
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def source_files() -> list[Path]:
    """The Java sources and resources the jar is built from, in a stable order."""
    roots = [JVM_DIR / "src", JVM_DIR / "resources"]
    return sorted(p for root in roots for p in root.rglob("*") if p.is_file())


def source_digest() -> str:
    """SHA-256 over every source's path (relative to the jvm folder) and bytes."""
    h = hashlib.sha256()
    for path in source_files():
        h.update(path.relative_to(JVM_DIR).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes().replace(b"\r\n", b"\n"))
        h.update(b"\0")
    return h.hexdigest()


def jar_digest(jar: Path = JAR) -> str | None:
    """The source digest a jar was built from (None when it records none)."""
    with zipfile.ZipFile(jar) as z:
        try:
            return z.read(DIGEST_ENTRY).decode().strip()
        except KeyError:
            return None


def jar_path() -> Path:
    """The jar (the tests check it against its sources; nothing is hashed at start-up)."""
    if not JAR.exists():
        raise SpanflowError(f"the real-time jar is missing ({JAR}); rebuild it: {_HOW}")
    return JAR


def find_javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(home) / "bin" / "javac")] if home else []
    found = shutil.which("javac")
    if found:
        candidates.append(found)
    return next((c for c in candidates if Path(c).exists()), None)


def spark_classpath() -> str:
    """PySpark's jars and jnats (from Maven Central, see :mod:`spanflow.spark.jvm.jars`)."""
    import pyspark

    from spanflow.spark.jvm.jars import jnats_classpath

    spark = str(Path(pyspark.__file__).parent / "jars" / "*")
    return os.pathsep.join([spark, *jnats_classpath()])


def compile_classes(out_dir: Path, javac: str | None = None) -> None:
    """Compile the Java sources into ``out_dir``."""
    javac = javac or find_javac()
    if javac is None:
        raise SpanflowError(f"no javac found (JAVA_HOME or PATH): {_HOW}")
    sources = [str(p) for p in source_files() if p.suffix == ".java"]
    cmd = [javac, "--release", "17", "-encoding", "UTF-8", "-nowarn", "-Xlint:none"]
    cmd += ["-cp", spark_classpath(), "-d", str(out_dir), *sources]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SpanflowError(f"javac failed:\n{done.stderr.strip()[-4000:]}")


def build(jar: Path = JAR, javac: str | None = None) -> Path:
    """Compile and package the jar reproducibly; returns its path."""
    with tempfile.TemporaryDirectory(prefix="spanflow-jvm-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        compile_classes(classes, javac)
        entries: dict[str, bytes] = {
            "META-INF/MANIFEST.MF": b"Manifest-Version: 1.0\r\nCreated-By: spanflow\r\n\r\n",
            DIGEST_ENTRY: (source_digest() + "\n").encode(),
        }
        for path in sorted(classes.rglob("*.class")):
            entries[path.relative_to(classes).as_posix()] = path.read_bytes()
        resources = JVM_DIR / "resources"
        for path in sorted(p for p in resources.rglob("*") if p.is_file()):
            entries[path.relative_to(resources).as_posix()] = path.read_bytes()
        tmp_jar = Path(tmp) / "out.jar"
        with zipfile.ZipFile(tmp_jar, "w", zipfile.ZIP_DEFLATED) as z:
            for name in [
                "META-INF/MANIFEST.MF",
                *sorted(n for n in entries if n != "META-INF/MANIFEST.MF"),
            ]:
                info = zipfile.ZipInfo(name, _FIXED_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                z.writestr(info, entries[name])
        shutil.copyfile(tmp_jar, jar)
    return jar


def class_entries(jar: Path) -> dict[str, bytes]:
    """Every .class file of a jar, by name."""
    with zipfile.ZipFile(jar) as z:
        return {n: z.read(n) for n in z.namelist() if n.endswith(".class")}


_HOW = "python -m spanflow.spark.connectors.jetstream.jvm_jar (needs a JDK's javac)"


if __name__ == "__main__":
    out = build()
    print(f"built {out} ({out.stat().st_size:,} bytes) from sources {source_digest()[:12]}")
    sys.exit(0)
