"""A node on a real Spark standalone cluster (a master and two workers from the pyspark
wheel) scales with load: a backlog its one executor cannot keep up with makes its agent
ask for a second executor, and once the backlog is drained and the fragment idles it
gives one back. Both changes are in the control log, with the pressure that made them,
and every record reaches the output exactly once across both (the executor given back
may have been running a task: Spark runs it again elsewhere)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanflow.local.cluster import Api, LocalCluster
from spanflow.local.spark_cluster import LocalSparkCluster
from tests.cluster.conftest import StartCluster
from tests.helpers import publish, read_records, stored, wait_for

pytestmark = pytest.mark.slow

N = 8000  # 32 s of work for one executor at 4 ms a record

TOPOLOGY = """\
sites: [{name: cloud, kind: cloud}]
nodes:
  - {name: big, site: cloud, local: true, capabilities: {cores: 2, slots: 2}}
"""

PIPELINE = """\
name: scaled
trigger: 1s
sources:
  - {id: src, stream: SC_IN, subjects: ["scin.>"], schema: {id: long},
     max_rows_per_batch: 400, partitions: 2, to: [slow]}
processors:
  - {id: slow, type: filter, function: "tests.cluster.slow_steps:slow_keep", to: [out]}
sinks:
  - {id: out, type: jetstream, stream: SC_OUT, subject: "scout.x"}
"""


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[LocalSparkCluster]:
    with LocalSparkCluster(workers=2, cores=1, memory="1g", work_dir=tmp_path / "spark") as c:
        yield c


@pytest.fixture
def cluster(spark_cluster: LocalSparkCluster, start_cluster: StartCluster) -> LocalCluster:
    """Started after the Spark cluster (fixtures set up in argument order), so it is
    stopped before the Spark cluster is."""
    node_args = [
        *("--master", spark_cluster.master_url, "--master-ui", spark_cluster.ui_url),
        *("--cores", "2", "--executors", "1:2", "--executor-memory", "768m"),
        *("--scale-out-after", "4", "--scale-in-after", "8", "--scale-cooldown", "8"),
        "--no-shed",
    ]
    return start_cluster(TOPOLOGY, node_args=node_args)


def scaled(api: Api) -> list[dict[str, Any]]:
    log = api.call("GET", "/api/v1/cluster/log?limit=1000")
    return [r["detail"] for r in log if r["kind"] == "node-scaled"]


def test_a_backlog_scales_out_and_idle_scales_in_with_every_record_once(cluster, spark_cluster):
    api = cluster.api()
    cluster.wait_for_nodes()
    publish(cluster.nats_url, "SC_IN", "scin.r", [{"id": i} for i in range(N)])
    api.call("POST", "/api/v1/pipelines", {"yaml": PIPELINE})

    # it starts at its minimum (a standalone master gave it both workers' cores)
    wait_for(lambda: any(r["executors"] == 1 for r in scaled(api)), 240)
    try:
        wait_for(lambda: any(r["executors"] == 2 for r in scaled(api)), 240)
    except AssertionError:
        logs = (cluster.data_dir / "logs" / "node-big.log").read_text()[-4000:]
        raise AssertionError(f"no scale-out; control log {scaled(api)}\n{logs}") from None
    out = next(r for r in scaled(api) if r["executors"] == 2)
    assert out["executors_before"] == 1
    assert out["pressure"] > 1.0 and "above 1" in out["reason"], out

    # drained, then idle: one executor given back
    wait_for(lambda: stored(cluster.nats_url, "SC_OUT") >= N, 300)
    wait_for(lambda: scaled(api)[-1]["executors"] == 1 and len(scaled(api)) >= 3, 120)
    back = scaled(api)[-1]
    assert back["executors_before"] == 2 and back["pressure"] <= 0.3, back
    assert api.call("GET", "/api/v1/nodes/big")["executors"] == 1

    # the second worker ran the second executor: it was really on the cluster
    assert len(list((spark_cluster.work_dir).glob("worker-*/app-*/*/stderr"))) >= 2
    ids = Counter(r["id"] for r in read_records(cluster.nats_url, "SC_OUT"))
    assert len(ids) == N and max(ids.values()) == 1, "lost or duplicated records"
