"""Jars a SparkSession takes from Maven Central beyond PySpark's own (``spanflow.maven``):
the official NATS Java client (jnats, which the real-time jar's source, sinks and
``jetstream://`` state store talk through), Spark's Kafka connector
(``format("kafka")``), matching PySpark's Scala 2.13 build, and Hadoop's S3A file
system (``s3a://`` checkpoints and savepoints), matching PySpark's Hadoop 3.5.0 client.

S3A takes the AWS SDK modules it uses rather than the SDK's 686 MB bundle, and no
Netty of its own (PySpark's is newer, and two copies break Spark's RPC). Its jars go on
the driver's and executors' class path (no copy per session); S3A reads its
credentials from the usual AWS sources (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, profiles, instance roles), never from a spanflow setting, and
``AWS_ENDPOINT_URL_S3`` (or ``AWS_ENDPOINT_URL``) names an S3-compatible server.

PySpark 4.3.0's own connector release is not on Maven Central yet; 4.2.0 is, and runs
on 4.3.0 (the tests read and write through it). What PySpark already ships (Hadoop's
client, Scala, SLF4J, compression codecs) is left out so one copy of each class is
loaded. A session built without the jars (no Maven, no network) still starts; a
pipeline that needs them then fails with the reason.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from spanflow.maven import Artifacts, MavenError, classpath

log = logging.getLogger(__name__)

SPARK_CONNECTOR_VERSION = "4.2.0"
PROVIDED = ("org.apache.hadoop:hadoop-client-runtime", "org.apache.hadoop:hadoop-client-api",
            "org.scala-lang:scala-library", "org.slf4j:slf4j-api", "org.lz4:lz4-java",
            "at.yawk.lz4:lz4-java", "org.xerial.snappy:snappy-java",
            "com.google.code.findbugs:jsr305", "org.apache.spark:spark-tags_2.13")  # fmt: skip
"""Artifacts PySpark's wheel already has in ``pyspark/jars``."""
JNATS_VERSION = "2.26.2"
JNATS = Artifacts("jnats", (f"io.nats:jnats:{JNATS_VERSION}",), excludes=PROVIDED)
"""The NATS client of the real-time jar (with Bouncy Castle, which it signs NKeys with)."""
KAFKA_CONNECTOR = Artifacts(
    "spark-sql-kafka",
    (f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_CONNECTOR_VERSION}",),
    excludes=PROVIDED,
)

HADOOP_VERSION = "3.5.0"
AWS_SDK_VERSION = "2.35.4"
"""The AWS SDK hadoop-aws 3.5.0 was built against."""
HADOOP_AWS = Artifacts(
    "hadoop-aws",
    (
        f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
        *(
            f"software.amazon.awssdk:{module}:{AWS_SDK_VERSION}"
            for module in (
                "s3",
                "s3-transfer-manager",
                "sts",
                "apache-client",
                "url-connection-client",
            )
        ),
    ),
    excludes=(
        *PROVIDED,
        "software.amazon.awssdk:bundle",
        "org.wildfly.openssl:wildfly-openssl",
        "io.netty:*",
    ),
)

_missing: dict[str, str] = {}
"""Why a set of jars could not be had in this process (its name → the reason)."""


_WITHOUT = {
    JNATS.name: "Real-Time Mode and jetstream:// state are not available",
    KAFKA_CONNECTOR.name: "Spark's Kafka connector is not available",
}


def session_jars() -> list[str]:
    """Every extra jar a session loads (a set that cannot be fetched is left out)."""
    jars: list[str] = []
    for artifacts in (JNATS, KAFKA_CONNECTOR):
        try:
            jars += [str(j) for j in classpath(artifacts)]
        except MavenError as exc:
            _missing[artifacts.name] = str(exc)
            log.warning("%s: %s", _WITHOUT[artifacts.name], exc)
    return jars


def jnats_classpath() -> list[str]:
    """jnats and its dependencies (the real-time jar is compiled against them)."""
    return [str(j) for j in classpath(JNATS)]


def class_path() -> str:
    """Jars that go on the JVMs' class path (S3A), joined; '' where they cannot be had."""
    try:
        return os.pathsep.join(str(j) for j in classpath(HADOOP_AWS))
    except MavenError as exc:
        _missing[HADOOP_AWS.name] = str(exc)
        log.warning("Hadoop's S3A file system is not available: %s", exc)
        return ""


def s3a_conf(environ: Mapping[str, str]) -> dict[str, str]:
    """Spark settings for S3A from the environment: an S3-compatible endpoint (path-style
    requests, plain HTTP when it says http://) and the region. No credentials here."""
    conf: dict[str, str] = {}
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        if endpoint.startswith("http://"):
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
            # Over plain HTTP the SDK signs the body in aws-chunked pieces, which stores
            # other than AWS (Ceph RGW here) reject with XAmzContentSHA256Mismatch; an
            # unsigned payload keeps the body's Content-MD5 check.
            for key in ("fs.s3a.signing-algorithm", "fs.s3a.s3.signing-algorithm"):
                conf[f"spark.hadoop.{key}"] = "AWS4UnsignedPayloadSignerType"
            # and the transfer manager's uploads (RocksDB's SST files) would sign in
            # chunks all the same: copy from local disk through the plain client
            conf["spark.hadoop.fs.s3a.optimized.copy.from.local.enabled"] = "false"
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region or endpoint:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region or "us-east-1"
    return conf


def fetch_all() -> int:
    """Fetch every extra jar now (the project's set-up does; raises when it cannot)."""
    return sum(len(classpath(a)) for a in (JNATS, KAFKA_CONNECTOR, HADOOP_AWS))


def why_missing(name: str) -> str | None:
    return _missing.get(name)
