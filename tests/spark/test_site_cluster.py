"""A site's fragments on a Spark standalone cluster of three workers (master and workers
from the pyspark wheel, one core each), as a plant too big for one machine would run
them: an edge pipeline keyed per device — windows and ``detect_anomalies``, its source
read in three partitions — gives on the cluster exactly what it gives on
``local[...]``; a worker SIGKILLed mid-stream loses and duplicates nothing (Spark runs
its tasks again elsewhere and loads their state partitions from the checkpoint); a
fourth worker started mid-stream gets an executor that runs tasks, as the driver's own
status API (``/api/v1/applications/<app>/executors``) shows. That run keeps its
checkpoints (offsets, state) in the site's NATS (``jetstream://``), where the executor
that takes a lost one's state partitions finds them."""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.local.server import free_port
from spanflow.local.spark_cluster import LocalSparkCluster, cluster_capacity
from spanflow.spark.runner import PipelineRunner
from tests.cluster.test_chaos import PIPELINE as CHAOS
from tests.helpers import (
    Feed,
    assert_feed_exactly_once,
    publish,
    read_records,
    run_pipeline_process,
    stored,
    wait_for,
)

pytestmark = pytest.mark.slow

BASE = 1_800_000_000
N = 2400


def _keyed(uid: str, out: str) -> str:
    return f"""
name: keyed-{out.lower()}-{uid}
trigger: 0s
sources:
  - id: readings
    stream: KIN_{uid}
    schema: {{device: string, t: double, ts: timestamp}}
    key: device
    event_time: ts
    max_out_of_orderness: 1s
    partitions: 3
    max_rows_per_batch: 600
    to: [per_10s, detect]
processors:
  - {{id: per_10s, type: window, tumbling: 10s, aggregates: {{n: count, mean: avg(t), top: max(t)}},
     to: [windows]}}
  - {{id: detect, type: detect_anomalies, fields: [t], to: [scores]}}
sinks:
  - {{id: windows, type: jetstream, stream: {out}_W_{uid}, subject: "{out.lower()}w{uid}"}}
  - {{id: scores, type: jetstream, stream: {out}_S_{uid}, subject: "{out.lower()}s{uid}"}}
"""


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSparkCluster]:
    work = tmp_path_factory.mktemp("site-spark")
    with LocalSparkCluster(workers=3, cores=1, memory="1g", work_dir=work) as cluster:
        yield cluster


def _windows(url: str, stream: str) -> set[tuple[Any, ...]]:
    return {
        (r["device"], r["window_start"], r["n"], round(r["mean"], 6), r["top"])
        for r in read_records(url, stream)
    }


def _scores(url: str, stream: str) -> dict[tuple[str, str], tuple[float, bool]]:
    return {
        (r["device"], r["ts"]): (round(r["anomaly_score"], 6), r["is_anomaly"])
        for r in read_records(url, stream)
    }


def test_a_keyed_edge_pipeline_on_three_workers_equals_local(
    spark, spark_cluster, nats_url, tmp_path, uid
):
    assert cluster_capacity(spark_cluster.ui_url).workers == 3
    records = [
        {"device": f"m{i % 6}", "t": 20.0 + (i % 17) * 0.3 + (25.0 if i == 1500 else 0.0),
         "ts": BASE + i * 0.05}
        for i in range(N)
    ]  # fmt: skip
    flush = {"device": "m0", "t": 20.0, "ts": BASE + 10_000}
    publish(nats_url, f"KIN_{uid}", f"kin{uid}.r", [*records, flush])
    expected_windows = len({(r["device"], int(r["ts"] // 10)) for r in records})

    local = PipelineRunner(
        spark,
        load_pipeline_text(_keyed(uid, "LOCAL")),
        nats_url=nats_url,
        checkpoint_dir=tmp_path / "local",
    ).start()
    try:
        wait_for(lambda: len(_windows(nats_url, f"LOCAL_W_{uid}")) >= expected_windows, 240)
        wait_for(lambda: stored(nats_url, f"LOCAL_S_{uid}") >= N + 1, 240)
    finally:
        local.stop()

    pipeline = tmp_path / "cluster.yaml"
    pipeline.write_text(_keyed(uid, "CLUSTER"))
    log = tmp_path / "cluster.log"
    proc = run_pipeline_process(
        pipeline, nats_url, tmp_path / "node", log, master=spark_cluster.master_url
    )
    try:
        wait_for(lambda: len(_windows(nats_url, f"CLUSTER_W_{uid}")) >= expected_windows, 300)
        wait_for(lambda: stored(nats_url, f"CLUSTER_S_{uid}") >= N + 1, 300)
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    # every worker ran an executor of the cluster run
    ran = {p.parent.name for p in spark_cluster.work_dir.glob("worker-*/app-*")}
    assert ran == {"worker-0", "worker-1", "worker-2"}
    assert _windows(nats_url, f"CLUSTER_W_{uid}") == _windows(nats_url, f"LOCAL_W_{uid}")
    cluster_scores = _scores(nats_url, f"CLUSTER_S_{uid}")
    assert cluster_scores == _scores(nats_url, f"LOCAL_S_{uid}")
    assert len({score for score, _ in cluster_scores.values()}) > 100  # real scores compared


def _executors(ui: str) -> list[dict[str, Any]]:
    """The application's executors from the driver's status API ([] while it does not
    answer: a driver busy replanning after a lost worker answers late)."""
    try:
        with urllib.request.urlopen(f"{ui}/api/v1/applications", timeout=15) as answer:
            app = json.loads(answer.read())[0]["id"]
        with urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/executors", timeout=15) as a:
            return list(json.loads(a.read()))
    except (OSError, ValueError, IndexError):
        return []


def _tasks_on_worker(ui: str, worker_ui_port: int) -> int:
    """Tasks the executors launched by the worker whose UI is on that port have run."""
    return sum(
        e["totalTasks"]
        for e in _executors(ui)
        if any(f":{worker_ui_port}/" in link for link in e.get("executorLogs", {}).values())
    )


def test_a_worker_killed_mid_stream_loses_nothing_and_a_new_worker_takes_tasks(
    spark_cluster, nats_url, tmp_path, uid
):
    name = f"w{uid}"
    text = (
        CHAOS.replace("name: chaos", f"name: {name}")
        .replace("CH_IN", f"WK_IN_{uid}")
        .replace('"chin.>"', f'"wkin{uid}.>"')
        .replace("CH_EVENTS", f"WK_EVENTS_{uid}")
        .replace("CH_WINDOWS", f"WK_WINDOWS_{uid}")
        .replace(
            "    max_out_of_orderness: 1s\n", "    max_out_of_orderness: 1s\n    partitions: 3\n"
        )
    )
    pipeline = tmp_path / "chaos.yaml"
    pipeline.write_text(text)
    ui_port = free_port()
    ui = f"http://127.0.0.1:{ui_port}"
    log = tmp_path / "run.log"
    proc = run_pipeline_process(
        pipeline,
        nats_url,
        tmp_path / "node",
        log,
        checkpoints=f"jetstream://wk{uid}/{name}",  # the site's NATS: every executor reaches it
        master=spark_cluster.master_url,
        spark_conf={"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)},
    )
    feed = Feed(nats_url, f"WK_IN_{uid}", f"wkin{uid}", rate=100.0)
    try:
        wait_for(lambda: stored(nats_url, f"WK_WINDOWS_{uid}") >= 4, 300)
        spark_cluster.kill_worker(0)
        before = stored(nats_url, f"WK_EVENTS_{uid}")
        wait_for(lambda: stored(nats_url, f"WK_EVENTS_{uid}") >= before + 300, 180)
        new = spark_cluster.add_worker()
        wait_for(lambda: _tasks_on_worker(ui, spark_cluster.worker_ui_ports[new]) > 0, 180)
        sent = feed.stop()
        assert_feed_exactly_once(nats_url, f"WK_EVENTS_{uid}", f"WK_WINDOWS_{uid}", sent)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()[-3000:]}") from None
    finally:
        feed.stop()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
