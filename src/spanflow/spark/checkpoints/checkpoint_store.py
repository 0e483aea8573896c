"""Checkpoint locations through Spark's Hadoop layer: ``jetstream://`` and any other URL.

A fragment's checkpoint (offsets, commits, RocksDB snapshots and changelogs) is written
by Spark's Hadoop file system for its location's scheme. ``jetstream://<store>/<path>``
is spanflow's own (``dev.spanflow.state.JetStreamFileSystem`` in the project's jar): the
files live in a JetStream stream of the node's site server, replicated like the site's
streams, so another node of the site resumes a fragment with its own empty disk. Local
paths keep using the local disk directly.

Savepoints and restores copy a checkpoint from one location to another: ``shutil`` for
two local paths, Hadoop's ``FileUtil.copy`` as soon as one of them is a URL (no copy of
state between nodes' disks is needed: both read the same store).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spanflow.nats.streams import server_list
from spanflow.spark.connectors.jetstream.realtime import share_identity
from spanflow.spec import locations

FILE_SYSTEM = "dev.spanflow.state.JetStreamFileSystem"
SESSION_CONF = {"spark.hadoop.fs.jetstream.impl": FILE_SYSTEM}
"""Registered from a session's start, so executors of a Spark cluster know the scheme."""


def configure(
    spark: SparkSession, nats_url: str, *, domain: str | None = None, replicas: int | None = None
) -> None:
    """Point ``jetstream://`` at this node's NATS (its site's server) and JetStream domain.

    ``replicas``: copies of a store's stream when it is first made; None tries three, two
    and then one (one per server of the site's cluster, up to three). Set before the first
    use in this process: Hadoop keeps one file system per store.
    """
    conf = _hadoop_conf(spark)
    conf.set("fs.jetstream.impl", FILE_SYSTEM)
    conf.set("fs.jetstream.servers", ",".join(server_list(nats_url)))
    if domain:
        conf.set("fs.jetstream.domain", domain)
    else:
        conf.unset("fs.jetstream.domain")
    conf.set("fs.jetstream.replicas", str(replicas or 0))
    share_identity(spark)


def exists(spark: SparkSession, location: str) -> bool:
    """Whether a checkpoint or savepoint location holds anything."""
    if not locations.is_url(location):
        return Path(location).exists()
    path, fs = _file_system(spark, location)
    return bool(fs.exists(path))


def remove(spark: SparkSession, location: str) -> None:
    """Delete a location and everything under it (nothing there is fine)."""
    if not locations.is_url(location):
        shutil.rmtree(location, ignore_errors=True)
        return
    path, fs = _file_system(spark, location)
    fs.delete(path, True)


def make_empty(spark: SparkSession, location: str) -> None:
    """An empty location (what a fragment that never checkpointed saves: restoring it
    starts the fragment fresh, as its first start would)."""
    if not locations.is_url(location):
        Path(location).mkdir(parents=True, exist_ok=True)
        return
    path, fs = _file_system(spark, location)
    fs.delete(path, True)
    fs.mkdirs(path)


def copy(spark: SparkSession, source: str, target: str) -> bool:
    """Replace ``target`` with a copy of ``source``; False when there is no source."""
    if not locations.is_url(source) and not locations.is_url(target):
        if not Path(source).is_dir():
            return False
        shutil.rmtree(target, ignore_errors=True)
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target)
        return True
    src, src_fs = _file_system(spark, _hadoop_location(source))
    if not src_fs.exists(src):
        return False
    dst, dst_fs = _file_system(spark, _hadoop_location(target))
    dst_fs.delete(dst, True)
    jvm: Any = spark._jvm
    jvm.org.apache.hadoop.fs.FileUtil.copy(src_fs, src, dst_fs, dst, False, _hadoop_conf(spark))
    return True


def write_text(spark: SparkSession, location: str, text: str) -> None:
    """Write a small file (replacing it) at a local path or any URL Hadoop serves."""
    if not locations.is_url(location):
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        Path(location).write_text(text, encoding="utf-8")
        return
    path, fs = _file_system(spark, location)
    out = fs.create(path, True)
    try:
        out.write(bytearray(text.encode()))
    finally:
        out.close()


def read_text(spark: SparkSession, location: str) -> str | None:
    """A small file's text, or None when there is none."""
    if not locations.is_url(location):
        file = Path(location)
        return file.read_text(encoding="utf-8") if file.is_file() else None
    path, fs = _file_system(spark, location)
    if not fs.exists(path):
        return None
    jvm: Any = spark._jvm
    stream = fs.open(path)
    try:
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def names(spark: SparkSession, location: str) -> list[str]:
    """The names of the entries of a directory (none when it is missing)."""
    if not locations.is_url(location):
        folder = Path(location)
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    path, fs = _file_system(spark, location)
    if not fs.exists(path):
        return []
    return sorted(str(s.getPath().getName()) for s in fs.listStatus(path))


def _hadoop_location(location: str) -> str:
    return location if locations.is_url(location) else Path(location).resolve().as_uri()


def file_system(spark: SparkSession, location: str) -> tuple[Any, Any]:
    """(Hadoop ``Path``, ``FileSystem``) of ``location`` — a local path or any URL
    Hadoop serves (``jetstream://``, ``s3a://``, ``hdfs://``)."""
    return _file_system(spark, _hadoop_location(location))


def _file_system(spark: SparkSession, location: str) -> tuple[Any, Any]:
    jvm: Any = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(location)
    return path, path.getFileSystem(_hadoop_conf(spark))


def _hadoop_conf(spark: SparkSession) -> Any:
    return spark._jsc.hadoopConfiguration()
