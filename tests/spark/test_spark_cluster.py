"""A real Spark standalone cluster (master and worker started from the pyspark wheel):
what a node on it offers the planner, and another machine joining it with
``spanflow spark-cluster --join``. (Pipelines on a cluster of three workers, against
``local[...]``, with a worker killed and one added: ``test_site_cluster.py``.)"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from spanflow.local.spark_cluster import LocalSparkCluster, cluster_capacity
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[LocalSparkCluster]:
    with LocalSparkCluster(workers=1, cores=1, memory="1g") as cluster:
        yield cluster


def test_a_node_on_the_cluster_offers_the_clusters_capacity(spark_cluster):
    from spanflow.cli.node import _spark_cluster_offer
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
