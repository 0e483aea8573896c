"""The real-time jar in the repository is built from the Java sources beside it."""

from __future__ import annotations

import subprocess

import pytest

from spanflow.spark.connectors.jetstream import jvm_jar


def test_the_jar_records_the_digest_of_its_sources():
    assert jvm_jar.jar_digest() == jvm_jar.source_digest(), (
        "the Java sources changed since the jar was built: "
        "run .venv/bin/python -m spanflow.spark.connectors.jetstream.jvm_jar and commit the jar"
    )


def test_the_digest_covers_every_source(tmp_path, monkeypatch):
    before = jvm_jar.source_digest()
    copy = tmp_path / "jvm"
    subprocess.run(["cp", "-r", str(jvm_jar.JVM_DIR), str(copy)], check=True)
    monkeypatch.setattr(jvm_jar, "JVM_DIR", copy)
    assert jvm_jar.source_digest() == before
    java = next((copy / "src").rglob("NatsClient.java"))
    java.write_text(java.read_text() + "\n// changed\n")
    assert jvm_jar.source_digest() != before


@pytest.mark.skipif(jvm_jar.find_javac() is None, reason="needs a JDK's javac to rebuild")
def test_rebuilding_from_the_sources_gives_the_same_classes(tmp_path):
    rebuilt = jvm_jar.build(tmp_path / "rebuilt.jar")
    assert jvm_jar.jar_digest(rebuilt) == jvm_jar.jar_digest()
    assert jvm_jar.class_entries(rebuilt) == jvm_jar.class_entries(jvm_jar.JAR)
