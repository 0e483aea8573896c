"""Jars a SparkSession takes from Maven Central beyond PySpark's own (``spanflow.maven``):
Spark's Kafka connector (``format("kafka")``), matching PySpark's Scala 2.13 build.

PySpark 4.3.0's own connector release is not on Maven Central yet; 4.2.0 is, and runs
on 4.3.0 (the tests read and write through it). What PySpark already ships (Hadoop's
client, Scala, SLF4J, compression codecs) is left out so one copy of each class is
loaded. A session built without the jars (no Maven, no network) still starts; a
pipeline that needs them then fails with the reason.
"""

from __future__ import annotations

import logging

from spanflow.maven import Artifacts, MavenError, classpath

log = logging.getLogger(__name__)

SPARK_CONNECTOR_VERSION = "4.2.0"
PROVIDED = ("org.apache.hadoop:hadoop-client-runtime", "org.apache.hadoop:hadoop-client-api",
            "org.scala-lang:scala-library", "org.slf4j:slf4j-api", "org.lz4:lz4-java",
            "at.yawk.lz4:lz4-java", "org.xerial.snappy:snappy-java",
            "com.google.code.findbugs:jsr305", "org.apache.spark:spark-tags_2.13")  # fmt: skip
"""Artifacts PySpark's wheel already has in ``pyspark/jars``."""
KAFKA_CONNECTOR = Artifacts(
    "spark-sql-kafka",
    (f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_CONNECTOR_VERSION}",),
    excludes=PROVIDED,
)

_missing: dict[str, str] = {}
"""Why a set of jars could not be had in this process (its name → the reason)."""


def session_jars() -> list[str]:
    """Every extra jar a session loads (empty where they cannot be fetched)."""
    try:
        return [str(j) for j in classpath(KAFKA_CONNECTOR)]
    except MavenError as exc:
        _missing[KAFKA_CONNECTOR.name] = str(exc)
        log.warning("Spark's Kafka connector is not available: %s", exc)
        return []


def why_missing(name: str) -> str | None:
    return _missing.get(name)
