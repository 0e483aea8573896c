"""Spark's class archive: a JVM started as spanflow starts one maps Spark's classes from
it, and a file changed since it was made is never handed to a JVM (one that maps a
truncated archive dies of SIGBUS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from spanflow.spark.jvm import class_archive
from spanflow.spark.jvm.java import ensure_java_home


def test_only_the_archive_its_note_describes_is_used(tmp_path: Path, monkeypatch):
    archive = tmp_path / "spark-classes-x.jsa"
    archive.write_bytes(b"\0" * 4096)
    assert not class_archive.usable(archive), "no note: not made here"
    class_archive._note(archive).write_text(json.dumps(class_archive._fingerprint(archive)))
    assert class_archive.usable(archive)
    with archive.open("r+b") as f:
        f.truncate(1024)
    assert not class_archive.usable(archive), "truncated since: never mapped"
    monkeypatch.setattr(class_archive, "archive_path", lambda: archive)
    assert class_archive.java_options() == ""
    monkeypatch.setenv(class_archive.ENV, "0")
    assert class_archive.java_options() == ""


CHILD = """
import sys
from spanflow.spark.session import DEFAULTS, build_session
from spanflow.spark.jvm import class_archive
options = class_archive.java_options()
assert options, "no usable archive"
log = sys.argv[1]
java = f"{DEFAULTS['spark.driver.extraJavaOptions']} {options} -Xlog:class+load=info:file={log}"
spark = build_session(conf={"spark.driver.extraJavaOptions": java})
spark.range(10).count()
spark.stop()
"""


def test_a_session_maps_sparks_classes_from_the_archive(tmp_path: Path):
    ensure_java_home()
    made = class_archive.ensure()
    assert made is not None and class_archive.usable(made)
    log = tmp_path / "classes.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(log)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = log.read_text().splitlines()
    context = [line for line in lines if "org.apache.spark.SparkContext " in line]
    assert context, "SparkContext was never loaded?"
    assert "shared objects file (top)" in context[0], context[0]
    shared = sum("shared objects file (top)" in line for line in lines)
    assert shared > 5000, f"only {shared} classes came from the archive"
