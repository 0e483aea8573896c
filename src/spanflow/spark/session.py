"""The SparkSession a node runs its pipelines in, configured for small edge machines."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spanflow.spark.connectors.jetstream import realtime
from spanflow.spark.jvm import class_archive
from spanflow.spark.jvm.jars import class_path, s3a_conf, session_jars
from spanflow.spark.jvm.java import ensure_java_home

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

DEFAULTS: dict[str, str] = {
    # Stateful queries freeze this into their checkpoint; 200 made first batches take >30 s.
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Keyed processors get records through pandas: integer columns with nulls stay
    # integers (pandas' Int64) instead of turning into floats.
    "spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype": "true",
    "spark.scheduler.mode": "FAIR",
    # Python task workers forked from a daemon that runs them niced, so a query's
    # source reader process starting on a busy node connects back within Spark's 10 s
    # (spanflow.spark.jvm.python_daemon).
    "spark.python.daemon.module": "spanflow.spark.jvm.python_daemon",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.minBatchesToRetain": "20",
    # C1 only: the C2 JIT kept compiling the classes each micro-batch generates, and a
    # small stateful query cost ≈520 ms of CPU per batch with it, ≈330 ms without
    # (see docs/benchmarks.md). Edge nodes have few cores to spare. C1 alone gets the
    # non-tiered code cache (48 MB), which a node running many queries filled within
    # minutes ("CodeCache is full. Compiler has been disabled": everything interpreted,
    # micro-batch latency doubled in benchmarks/realtime_latency.py); 240 MB is the
    # tiered default, reserved address space that is committed only as code is compiled.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m",
    # Hadoop without its native library (the pyspark wheel ships none) forks a process
    # for many file operations. Spark's default checkpoint manager goes through
    # FileContext, which forks `readlink` on every status check (≈10 per micro-batch);
    # the FileSystem-based manager does not (offset and commit logging went 44 → 24 ms
    # and 63 → 28 ms per batch, docs/benchmarks.md). Checkpoint files are still written
    # under a temporary name and renamed, which is atomic on a local disk.
    #
    # `fs.file.impl` must stay Hadoop's LocalFileSystem: RocksDB uploads its snapshots
    # with `FileSystem.copyFromLocalFile`, which casts the local file system to
    # LocalFileSystem; with RawLocalFileSystem every snapshot upload failed
    # (ClassCastException), which fails a transformWithState query at its first batch
    # and left window queries replaying an ever longer changelog.
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
    # jetstream:// checkpoints (spanflow.spark.checkpoints.checkpoint_store), known to executors too
    "spark.hadoop.fs.jetstream.impl": "dev.spanflow.state.JetStreamFileSystem",
}


CORES = 2
"""Task slots for micro-batch work: an edge node's cores."""

EXECUTOR_JIT = DEFAULTS["spark.driver.extraJavaOptions"]
"""C1 only with a 240 MB code cache, as the driver: what the executors of a cluster run."""


def build_session(
    *,
    master: str | None = None,
    app_name: str = "spanflow",
    conf: Mapping[str, str] | None = None,
    realtime_slots: int = 0,
) -> SparkSession:
    """A SparkSession with spanflow's defaults and its data sources registered.

    ``master`` defaults to ``local[N,3]``: :data:`CORES` slots plus ``realtime_slots``
    (each task of a Real-Time Mode query holds a slot for its whole batch, see
    :mod:`spanflow.spark.connectors.jetstream.realtime`), each task retried up to three times so a
    transient broker error retries the task instead of failing the query.
    """
    ensure_java_home()
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers import users' functions by module name: give them the driver's path.
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, os.getcwd()]))
    default_master = f"local[{CORES + max(0, realtime_slots)},3]"
    chosen = master or os.environ.get("SPANFLOW_SPARK_MASTER", default_master)
    builder = SparkSession.builder.appName(app_name).master(chosen)
    needed = realtime.session_conf()
    needed["spark.jars"] = ",".join([needed["spark.jars"], *session_jars()])
    needed.update(_class_path_conf(), **s3a_conf(os.environ))
    settings = {**DEFAULTS, **needed, **_cluster_conf(chosen), **(conf or {})}
    if conf and "spark.jars" in conf:  # the user's jars and the real-time jar
        settings["spark.jars"] = f"{conf['spark.jars']},{needed['spark.jars']}"
    if not conf or "spark.driver.extraJavaOptions" not in conf:
        archive = class_archive.java_options()  # Spark's classes mapped, not loaded
        if archive:
            settings["spark.driver.extraJavaOptions"] += f" {archive}"
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPANFLOW_SPARK_LOG_LEVEL", "ERROR"))
    register_data_sources(spark)
    return spark


def _class_path_conf() -> dict[str, str]:
    """Jars on the JVMs' own class path (S3A: a file system Hadoop looks up by class
    name, loaded before any ``spark.jars``)."""
    jars = class_path()
    if not jars:
        return {}
    return {"spark.driver.extraClassPath": jars, "spark.executor.extraClassPath": jars}


def _cluster_conf(master: str) -> dict[str, str]:
    """What executors outside this process need (a Spark standalone or Kubernetes
    cluster): the driver's module path, so Python workers import spanflow and users'
    functions by name. The real-time jar travels with ``spark.jars``; executors run
    ``PYSPARK_PYTHON``, the driver's interpreter, which must exist at the same path on
    every worker (the same virtual environment, or an image built with it)."""
    if master.startswith("local"):
        return {}
    return {
        "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        # The driver's JIT settings (see DEFAULTS) for the executors too: they compile the
        # same classes generated every micro-batch.
        "spark.executor.extraJavaOptions": EXECUTOR_JIT,
    }


WARM_MODULES = ("pyarrow", "spanflow.spark.connectors.jetstream.source")
"""What a warmed Python worker has imported: what a JetStream source's batch needs."""


def warm_python_workers(
    spark: SparkSession, workers: int, modules: tuple[str, ...] = WARM_MODULES
) -> None:
    """Start Spark's Python daemon and ``workers`` Python workers, with ``modules``
    imported, by running a one-row-per-worker job (Spark keeps idle
    workers for a minute and hands them to the next tasks; see
    :func:`spanflow.runtime.spark_host.keep_python_workers_warm`)."""

    def warm(batches: Iterator[Any]) -> Iterator[Any]:
        import importlib

        for module in modules:  # kept by the worker for the tasks it serves next
            importlib.import_module(module)
        yield from batches

    n = max(1, workers)
    spark.range(0, n, 1, n).mapInArrow(warm, "id long").collect()


def rehearse_streaming(spark: SparkSession) -> None:
    """Run a small stateful streaming query to its end: event-time windows over a
    watermark in RocksDB state, written through ``foreachBatch``.

    A session's first streaming batch pays for what no batch job loads: RocksDB's
    native library and its state store, the streaming planner's and code generator's
    first passes, the JIT still cold, the Python callback for ``foreachBatch``. Measured
    on this 2-core machine, the first output of the chaos pipeline's window query on a
    fresh session came 8.0 s after its start, 5.8 s after this rehearsal (first batch
    4.4 → 1.8 s). The class archive's warm-up (``class_archive``) runs it too."""
    from pyspark.sql import functions as F

    from spanflow.spark.checkpoints.source_names import evolution

    with tempfile.TemporaryDirectory(prefix="spanflow-rehearsal-") as work:
        data = Path(work) / "in"
        data.mkdir()
        (data / "a.json").write_text(
            "\n".join(json.dumps({"k": f"d{i % 5}", "v": i, "ts": i}) for i in range(100))
        )
        with evolution(spark, enabled=False):  # an unnamed source, as it reads a folder
            stream = (
                spark.readStream.schema("k string, v long, ts long")
                .json(str(data))
                .withColumn("t", F.timestamp_seconds("ts"))
                .withWatermark("t", "10 seconds")
                .groupBy("k", F.window("t", "10 seconds"))
                .count()
            )
            query = (
                stream.writeStream.outputMode("update")
                .option("checkpointLocation", str(Path(work) / "checkpoint"))
                .trigger(availableNow=True)
                .foreachBatch(_collect)
                .start()
            )
        query.awaitTermination(120)


def _collect(batch: DataFrame, batch_id: int) -> None:
    batch.collect()


def register_data_sources(spark: SparkSession) -> None:
    from spanflow.spark.connectors.jetstream.source import JetStreamDataSource

    spark.dataSource.register(JetStreamDataSource)


def _python() -> str:
    return sys.executable
