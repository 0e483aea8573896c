"""A global fragment on a real Spark standalone cluster (master and worker started from
the pyspark wheel): its results equal the same pipeline's on ``local[...]``. The cluster
run is its own process (one SparkContext per process): ``spanflow run --master
spark://…``, executors in the worker's JVM, Python workers there importing spanflow."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.local.spark_cluster import LocalSparkCluster, cluster_capacity
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_records, run_pipeline_process, wait_for

pytestmark = pytest.mark.slow

BASE = 1_800_000_000
N = 1200


def _pipeline(uid: str, out: str) -> str:
    return f"""
name: global-{out.lower()}-{uid}
trigger: 0s
sources:
  - id: readings
    stream: GIN_{uid}
    schema: {{id: long, site: string, v: double, ts: timestamp}}
    key: site
    event_time: ts
    max_out_of_orderness: 1s
    to: [per_10s]
processors:
  - id: per_10s
    type: window
    tumbling: 10s
    aggregates: {{n: count, total: sum(v), top: max(v)}}
    to: [out]
sinks:
  - {{id: out, type: jetstream, stream: {out}_{uid}, subject: "{out.lower()}{uid}"}}
"""


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[LocalSparkCluster]:
    with LocalSparkCluster(workers=1, cores=1, memory="1g") as cluster:
        yield cluster


def _windows(url: str, stream: str) -> set[tuple[str, str, int, float, float]]:
    return {
        (r["site"], r["window_start"], r["n"], round(r["total"], 6), r["top"])
        for r in read_records(url, stream)
    }


def test_a_global_fragment_on_a_standalone_cluster_equals_local(
    spark, spark_cluster, nats_url, tmp_path, uid
):
    capacity = cluster_capacity(spark_cluster.ui_url)
    assert (capacity.workers, capacity.cores, capacity.memory_mb) == (1, 1, 1024)

    records = [
        {"id": i, "site": f"s{i % 4}", "v": float((i * 13) % 97), "ts": BASE + i * 0.25}
        for i in range(N)
    ]
    flush = {"id": N, "site": "s0", "v": 0.0, "ts": BASE + 10_000}
    publish(nats_url, f"GIN_{uid}", f"gin{uid}.r", [*records, flush])
    expected_windows = len({(r["site"], int(r["ts"] // 10)) for r in records})

    # the same pipeline on local[...] (this test session's Spark)
    local = PipelineRunner(
        spark,
        load_pipeline_text(_pipeline(uid, "LOCAL")),
        nats_url=nats_url,
        checkpoint_dir=tmp_path / "local",
    ).start()
    try:
        wait_for(lambda: len(_windows(nats_url, f"LOCAL_{uid}")) >= expected_windows, 180)
    finally:
        local.stop()

    pipeline = tmp_path / "cluster.yaml"
    pipeline.write_text(_pipeline(uid, "CLUSTER"))
    log = tmp_path / "cluster.log"
    proc = run_pipeline_process(
        pipeline, nats_url, tmp_path / "node", log, master=spark_cluster.master_url
    )
    try:
        wait_for(lambda: len(_windows(nats_url, f"CLUSTER_{uid}")) >= expected_windows, 300)
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    # the work ran on the cluster: the worker started an executor for the app
    assert list((spark_cluster.work_dir / "worker-0").glob("app-*/*/stderr"))
    assert _windows(nats_url, f"CLUSTER_{uid}") == _windows(nats_url, f"LOCAL_{uid}")


def test_a_node_on_the_cluster_offers_the_clusters_capacity(spark_cluster):
    from spanflow.cli.cluster import _spark_cluster_offer
    from spanflow.local.server import free_port

    assert _spark_cluster_offer(spark_cluster.master_url, spark_cluster.ui_url, None) == (
        1,
        "1024m",
    )
    # no UI there: the machine's own capacity (None: detected), and the memory given kept
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert _spark_cluster_offer(spark_cluster.master_url, nowhere, "2g") == (None, "2g")


def test_another_machine_joins_the_sites_master_with_spark_cluster_join(spark_cluster, tmp_path):
    """`spanflow spark-cluster --join` starts only workers, for a master elsewhere: the
    master counts them, and forgets them when they stop."""
    import subprocess
    import sys

    from tests.helpers import wait_for

    log = tmp_path / "join.log"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "spanflow.cli", "spark-cluster"),
            *("--join", spark_cluster.master_url, "--master-ui", spark_cluster.ui_url),
            *("--cores", "1", "--memory", "512m"),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: cluster_capacity(spark_cluster.ui_url).workers == 2, 120)
        assert cluster_capacity(spark_cluster.ui_url).memory_mb == 1024 + 512
        assert f"joining {spark_cluster.master_url}" in log.read_text()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    wait_for(lambda: cluster_capacity(spark_cluster.ui_url).workers == 1, 120)
