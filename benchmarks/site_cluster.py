"""A site's fragment on a Spark standalone cluster: what more workers change, what a lost
worker costs, and how fast executors come and go.

One machine with two cores, so no speed-up can show: what is measured is whether the
work and the state really spread, that spreading costs no throughput, what a worker's
death costs, and the executors' own start and release — the parts that carry over to
real machines. A master and three one-core workers are started from the pyspark wheel.

1. **Spread and throughput**: a backlog of ``--records`` readings (a filter into an
   events stream and 10 s windows per device, the source read in three partitions, six
   state partitions) drained by the same pipeline on one executor (``spark.cores.max=1``,
   the baseline of this same run), on two and on three; rows/s from the first stored event to
   the last, the tasks each executor ran and the state partitions per executor, from
   the driver's status API.
2. **A worker lost**: the pipeline on three executors under a steady feed; one worker
   SIGKILLed with its executor; the longest pause in stored events around it, the time
   until events published after the kill are stored again, lost / duplicated.
3. **Executors asked for and given back** (the mechanism ``spanflow node --executors``
   scales with): the time from ``requestTotalExecutors`` to the new executor
   registered, and from ``killExecutors`` to it gone.

Run: ``.venv/bin/python benchmarks/site_cluster.py [--records 200000]``
Figures go to ``benchmarks/results/site_cluster.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from chaos import stored, wait
from tests.helpers import Feed, publish

from spanflow.local.server import free_port
from spanflow.local.spark_cluster import LocalSparkCluster
from spanflow.nats import EmbeddedNats
from spanflow.testing.streams import stored as count

RESULTS = Path(__file__).resolve().parent / "results"

PIPELINE = """\
name: {name}
trigger: 1s
sources:
  - id: src
    stream: {stream}
    subjects: ["{prefix}.>"]
    schema: {{device: string, ts: timestamp, id: long}}
    event_time: ts
    max_out_of_orderness: 1s
    partitions: 3
    max_rows_per_batch: 20000
    to: [by_device, keep]
processors:
  - {{id: keep, type: filter, where: "id >= 0", to: [events]}}
  - {{id: by_device, type: key_by, key: device, to: [count]}}
  - {{id: count, type: window, tumbling: 10s, aggregates: {{n: count}}, to: [windows]}}
sinks:
  - {{id: events, type: jetstream, stream: {stream}_EV, subject: "{prefix}ev.x"}}
  - {{id: windows, type: jetstream, stream: {stream}_W, subject: "{prefix}w.x"}}
"""


def run_pipeline(
    work: Path, nats: str, cluster: LocalSparkCluster, name: str, stream: str, cores: int
) -> tuple[subprocess.Popen[bytes], str]:
    """``spanflow run`` on the cluster with at most ``cores`` executors; the driver UI."""
    path = work / f"{name}.yaml"
    path.write_text(PIPELINE.format(name=name, stream=stream, prefix=stream.lower()))
    ui_port = free_port()
    conf = {
        "spark.cores.max": str(cores),
        "spark.executor.cores": "1",
        "spark.executor.memory": "768m",
        "spark.sql.shuffle.partitions": "6",
        "spark.ui.enabled": "true",
        "spark.ui.port": str(ui_port),
    }
    args = [sys.executable, "-m", "spanflow.cli", "run", str(path), "--nats", nats]
    args += ["--data-dir", str(work / name), "--master", cluster.master_url]
    for key, value in conf.items():
        args += ["--spark-conf", f"{key}={value}"]
    log = (work / f"{name}.log").open("ab")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{ui_port}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def executors(ui: str) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{ui}/api/v1/applications", timeout=15) as answer:
            app = json.loads(answer.read())[0]["id"]
        with urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/executors", timeout=15) as a:
            return [e for e in json.loads(a.read()) if e["id"] != "driver"]
    except (OSError, ValueError, IndexError):
        return []


def state_partitions(ui: str, partitions: int = 6) -> dict[str, int]:
    """Tasks of the stateful stages per executor: stages of ``partitions`` tasks (the
    shuffle partitions, one state partition per task and batch) — which executors hold
    state."""
    try:
        with urllib.request.urlopen(f"{ui}/api/v1/applications", timeout=15) as answer:
            app = json.loads(answer.read())[0]["id"]
        url = f"{ui}/api/v1/applications/{app}/stages?status=complete&details=true"
        with urllib.request.urlopen(url, timeout=60) as answer:
            stages = json.loads(answer.read())
    except (OSError, ValueError, IndexError):
        return {}
    out: Counter[str] = Counter()
    for stage in stages:
        if stage.get("numTasks") != partitions:
            continue
        for task in (stage.get("tasks") or {}).values():
            out[str(task.get("executorId", "?"))] += 1
    return dict(out)


def drain(
    work: Path, nats: str, cluster: LocalSparkCluster, records: int, cores: int
) -> dict[str, Any]:
    stream = f"TP{cores}"
    publish(nats, stream, f"{stream.lower()}.r", (Feed.reading(i) for i in range(records)))
    proc, ui = run_pipeline(work, nats, cluster, f"tp{cores}", stream, cores)
    try:
        wait(lambda: count(nats, f"{stream}_EV") >= records, 900, f"{records} events")
        times = sorted(t for _, t in stored(nats, f"{stream}_EV"))
        tasks = {e["id"]: e["totalTasks"] for e in executors(ui)}
        state = state_partitions(ui)
    finally:
        stop(proc)
    seconds = times[-1] - times[0]
    return {
        "executors": cores,
        "records": records,
        "seconds_first_to_last": round(seconds, 2),
        "rows_per_s": round(records / seconds, 1),
        "tasks_per_executor": tasks,
        "stateful_tasks_per_executor": state,
    }


def worker_loss(work: Path, nats: str, cluster: LocalSparkCluster, rate: float) -> dict[str, Any]:
    stream = "WL"
    proc, _ui = run_pipeline(work, nats, cluster, "loss", stream, 3)
    feed = Feed(nats, stream, stream.lower(), rate=rate)
    try:
        wait(lambda: count(nats, f"{stream}_EV") >= 10 * rate, 600, "a steady output")
        time.sleep(10)
        killed_at = time.time()
        killed_seq = feed.sent
        cluster.kill_worker(0)
        wait(
            lambda: count(nats, f"{stream}_EV") > killed_seq + 2 * rate,
            300,
            "events after the kill",
        )
        time.sleep(20)
        sent = feed.stop()
        wait(lambda: count(nats, f"{stream}_EV") >= sent, 300, "every event")
    finally:
        feed.stop()
        stop(proc)
    events = stored(nats, f"{stream}_EV")
    ids = Counter(json.loads(d)["id"] for d, _ in events)
    times = sorted(t for _, t in events)
    around = [b - a for a, b in itertools.pairwise(times) if a > killed_at - 5]
    first_after = min(t for d, t in events if json.loads(d)["id"] > killed_seq)
    return {
        "rate": rate,
        "sent": sent,
        "lost": len(set(range(sent)) - set(ids)),
        "duplicated": sum(n - 1 for n in ids.values() if n > 1),
        "longest_pause_s": round(max(around, default=0.0), 2),
        "first_new_event_after_kill_s": round(first_after - killed_at, 2),
    }


def executor_churn(cluster: LocalSparkCluster, rounds: int) -> dict[str, Any]:
    from spanflow.spark.jvm.executors import ExecutorControl
    from spanflow.spark.session import build_session

    spark = build_session(
        master=cluster.master_url,
        conf={"spark.executor.cores": "1", "spark.executor.memory": "768m",
              "spark.cores.max": "2"},
    )  # fmt: skip
    control = ExecutorControl(spark)
    out_s, in_s = [], []
    try:
        wait(lambda: len(control.executor_ids()) >= 1, 120, "a first executor")
        control.scale_to(1)
        wait(lambda: len(control.executor_ids()) == 1, 120, "one executor")
        for _ in range(rounds):
            start = time.monotonic()
            control.scale_to(2)
            wait(lambda: len(control.executor_ids()) == 2, 120, "a second executor")
            out_s.append(time.monotonic() - start)
            start = time.monotonic()
            control.scale_to(1)
            wait(lambda: len(control.executor_ids()) == 1, 120, "one executor again")
            in_s.append(time.monotonic() - start)
    finally:
        spark.stop()
    return {
        "scale_out_s": [round(v, 2) for v in out_s],
        "scale_in_s": [round(v, 2) for v in in_s],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="site-cluster-") as tmp:
        work = Path(tmp)
        with (
            EmbeddedNats(work / "nats") as nats,
            LocalSparkCluster(workers=3, cores=1, memory="1g", work_dir=work / "spark") as cluster,
        ):
            drains = {}
            for n in (1, 2, 3):
                d = drains[n] = drain(work, nats.url, cluster, args.records, n)
                tasks, state = d["tasks_per_executor"], d["stateful_tasks_per_executor"]
                print(
                    f"{n} executor(s): {d['rows_per_s']:,.0f} rows/s, tasks {tasks}, state {state}"
                )
            churn = executor_churn(cluster, args.rounds)
            print(f"executor out {churn['scale_out_s']} s, in {churn['scale_in_s']} s")
            loss = worker_loss(work, nats.url, cluster, args.rate)
            print(
                f"worker killed: lost {loss['lost']}, duplicated {loss['duplicated']}, longest "
                f"pause {loss['longest_pause_s']} s, "
                f"new events after {loss['first_new_event_after_kill_s']} s"
            )
    result = {
        "benchmark": "site_cluster",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "workers": 3,
        "drains": {str(n): d for n, d in drains.items()},
        "throughput_ratio_2_to_1": round(drains[2]["rows_per_s"] / drains[1]["rows_per_s"], 3),
        "throughput_ratio_3_to_1": round(drains[3]["rows_per_s"] / drains[1]["rows_per_s"], 3),
        "executor_churn": churn,
        "worker_loss": loss,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "site_cluster.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"throughput against one executor: 2 -> {result['throughput_ratio_2_to_1']}, "
        f"3 -> {result['throughput_ratio_3_to_1']}"
    )


if __name__ == "__main__":
    main()
