"""Checkpoint and recovery time against state size: a local disk vs ``jetstream://`` vs
``s3a://``.

Measured in one run, on this machine, so the ratio holds when absolute figures do not.
A stateful query keeps one row per key in RocksDB (the state store spanflow uses, with
changelog checkpointing): ``groupBy(key).agg(max(payload), count)`` over Spark's
``rate-micro-batch`` source, 1 KB of barely compressible payload per key, so the state
is ≈ S for S / 1 KB keys. Per backend and size:

1. **build**: batches of up to 100,000 new keys until every key exists;
2. **checkpoint**: 5 batches updating 1,000 keys each (≈1 MB changed): a batch's
   commit time (``stateOperators.commitTimeMs``: RocksDB commit plus the changelog
   upload) and its whole duration; the incremental checkpoint the seed asks < 1 s of;
3. **recovery**: the query stopped and started again on the same checkpoint, as a node
   replacing a dead one would (a new query run: the state store downloads the
   checkpoint into a fresh working directory, then replays changelogs): wall time from
   ``start()`` to the first batch done.

Also the raw store: writing and reading S bytes as 16 MB files through Hadoop (what a
RocksDB snapshot upload and a recovery download move). ``jetstream://`` runs on an
embedded NATS server as deployed (fsync on every write); ``s3a://`` on Ceph's RADOS
Gateway over a one-OSD cluster that keeps objects in memory (``spanflow.local.ceph_s3``),
on the same machine.

Figures are printed and written to ``benchmarks/results/checkpoint.json``.
Run: ``.venv/bin/python benchmarks/checkpoint.py [--sizes 10,100,1000]`` (MB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from spanflow.local.ceph_s3 import LocalCephS3
from spanflow.nats import EmbeddedNats
from spanflow.spark.checkpoints import checkpoint_store
from spanflow.spark.session import build_session

RESULTS = Path(__file__).resolve().parent / "results"
PAYLOAD = 1024
BUILD_ROWS = 100_000
UPDATE_ROWS = 1_000
UPDATES = 5
FILE_MB = 16


def stateful_query(spark: Any, keys: int, rows_per_batch: int, start_batch: int) -> Any:
    """One row per key, PAYLOAD bytes of hex each: the state is about keys * PAYLOAD."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("startTimestamp", 0)
        .load()
    )
    key = (F.col("value") + F.lit(start_batch)) % keys
    hexes = [F.sha2(F.concat(F.col("value").cast("string"), F.lit(str(i))), 512) for i in range(8)]
    return (
        df.select(key.alias("key"), F.concat(*hexes).alias("payload"))
        .groupBy("key")
        .agg(F.max("payload").alias("p"), F.count("*").alias("n"))
    )


def run_batches(
    spark: Any, checkpoint: str, keys: int, rows: int, batches: int
) -> tuple[list[dict[str, Any]], float]:
    """Run ``batches`` batches of ``rows`` rows; progress per batch and the wall time
    from start to the first batch done."""
    query = (
        stateful_query(spark, keys, rows, 0)
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    started = time.perf_counter()
    first_done: float | None = None
    seen: list[dict[str, Any]] = []
    try:
        while len(seen) < batches:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            for p in query.recentProgress:
                if p["batchId"] not in {s["batchId"] for s in seen} and p["numInputRows"] > 0:
                    seen.append(dict(p))
                    if first_done is None:
                        first_done = time.perf_counter() - started
            time.sleep(0.05)
    finally:
        query.stop()
    return seen[:batches], first_done or 0.0


def measure_query(spark: Any, checkpoint: str, size_mb: int) -> dict[str, Any]:
    keys = size_mb * 1024 * 1024 // PAYLOAD
    build_batches = -(-keys // BUILD_ROWS)
    t0 = time.perf_counter()
    built, _ = run_batches(spark, checkpoint, keys, min(keys, BUILD_ROWS), build_batches)
    build_s = time.perf_counter() - t0
    state = built[-1]["stateOperators"][0]
    updates, recovery_s = run_batches(spark, checkpoint, keys, UPDATE_ROWS, UPDATES + 1)
    # the first batch after the restart loads the state: recovery; the rest: checkpoints
    steady = updates[1:]
    commits = [b["stateOperators"][0]["commitTimeMs"] for b in steady]
    durations = [b["durationMs"]["triggerExecution"] for b in steady]
    return {
        "keys": keys,
        "state_rows": state["numRowsTotal"],
        "state_bytes_written": sum(
            b["stateOperators"][0].get("customMetrics", {}).get("rocksdbTotalBytesWritten", 0)
            for b in built
        ),
        "build_s": round(build_s, 1),
        "checkpoint_commit_ms_median": sorted(commits)[len(commits) // 2],
        "checkpoint_commit_ms_max": max(commits),
        "batch_ms_median": sorted(durations)[len(durations) // 2],
        "recovery_s": round(recovery_s, 2),
        "recovery_batch_ms": updates[0]["durationMs"]["triggerExecution"],
        "recovery_rocksdb": {
            k: updates[0]["stateOperators"][0].get("customMetrics", {}).get(k)
            for k in (
                "rocksdbLoadLatencyMs",
                "rocksdbNumLoadedFromDfs",
                "rocksdbLoadFromSnapshotLatencyMs",
                "rocksdbNumReplayChangelogFiles",
                "rocksdbReplayChangeLogLatencyMs",
            )
        },
    }


def measure_store(spark: Any, root: str, size_mb: int) -> dict[str, Any]:
    """Write then read ``size_mb`` MB as FILE_MB files through Hadoop."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(root)
    fs = path.getFileSystem(conf)
    block = bytearray(os.urandom(1024 * 1024))
    files = max(1, size_mb // FILE_MB)
    per_file = min(size_mb, FILE_MB)
    t0 = time.perf_counter()
    for i in range(files):
        out = fs.create(jvm.org.apache.hadoop.fs.Path(f"{root}/sst/{i}.sst"), True)
        for _ in range(per_file):
            out.write(block)
        out.close()
    write_s = time.perf_counter() - t0
    sink = jvm.org.apache.commons.io.output.NullOutputStream.INSTANCE
    t0 = time.perf_counter()
    for i in range(files):
        stream = fs.open(jvm.org.apache.hadoop.fs.Path(f"{root}/sst/{i}.sst"))
        jvm.org.apache.commons.io.IOUtils.copyLarge(stream, sink)
        stream.close()
    read_s = time.perf_counter() - t0
    fs.delete(path, True)
    moved = files * per_file
    return {
        "mb": moved,
        "write_s": round(write_s, 2),
        "read_s": round(read_s, 2),
        "write_mb_per_s": round(moved / write_s, 1),
        "read_mb_per_s": round(moved / read_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="10,100", help="state sizes in MB, comma-separated")
    ap.add_argument("--out", type=Path, default=RESULTS / "checkpoint.json")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    work = Path(tempfile.mkdtemp(prefix="spanflow-bench-ckpt-"))
    results: dict[str, dict[str, Any]] = {"local": {}, "jetstream": {}, "s3a": {}}
    try:
        with EmbeddedNats(work / "nats") as server, LocalCephS3() as s3:
            s3.make_bucket("bench")
            os.environ.update(AWS_ENDPOINT_URL_S3=s3.endpoint, AWS_ACCESS_KEY_ID=s3.access_key,
                              AWS_SECRET_ACCESS_KEY=s3.secret_key)  # fmt: skip
            spark = build_session(app_name="spanflow-bench-checkpoint")
            checkpoint_store.configure(spark, server.url)
            roots = {"local": (work / "local").resolve().as_uri(), "jetstream": "jetstream://bench",
                     "s3a": "s3a://bench"}  # fmt: skip
            for size in sizes:
                for backend, root in roots.items():
                    print(f"{backend}, {size} MB of state …", flush=True)
                    store = measure_store(spark, f"{root}/raw{size}", size)
                    query = measure_query(spark, f"{root}/q{size}", size)
                    results[backend][f"{size}MB"] = {"store": store, "query": query}
                    print(
                        f"  store: write {store['write_mb_per_s']} MB/s, read "
                        f"{store['read_mb_per_s']} MB/s; checkpoint commit "
                        f"{query['checkpoint_commit_ms_median']} ms (median, {UPDATE_ROWS} keys "
                        f"changed), recovery {query['recovery_s']} s",
                        flush=True,
                    )
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = {
        f"{size}MB": {
            "commit_jetstream_over_local": _ratio(results, size, "checkpoint_commit_ms_median"),
            "recovery_jetstream_over_local": _ratio(results, size, "recovery_s"),
            "commit_s3a_over_local": _ratio(results, size, "checkpoint_commit_ms_median", "s3a"),
            "recovery_s3a_over_local": _ratio(results, size, "recovery_s", "s3a"),
        }
        for size in sizes
    }
    print(json.dumps(ratios, indent=2))
    out = {
        "benchmark": "checkpoint",
        "machine": platform.platform(),
        "cores": os.cpu_count(),
        "payload_bytes_per_key": PAYLOAD,
        "update_rows_per_batch": UPDATE_ROWS,
        "results": results,
        "ratios": ratios,
    }
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


def _ratio(
    results: dict[str, dict[str, Any]], size: int, key: str, remote_name: str = "jetstream"
) -> float | None:
    local = results["local"][f"{size}MB"]["query"][key]
    remote = results[remote_name][f"{size}MB"]["query"][key]
    return round(remote / local, 2) if local else None


if __name__ == "__main__":
    main()
