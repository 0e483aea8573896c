"""Node throughput against Apache Flink: spanflow and PyFlink on the same events, one run.

The workloads of ``node_throughput.py``, each run by Flink and then by spanflow, one
after the other in the same run, on the same cores (parallelism = Spark's task slots):

1. **window**: decode JSON → filter ``temperature > -50`` → 10 s tumbling event-time
   window count per device. Flink: PyFlink's Table API (Flink SQL, what a PyFlink user
   writes), a ``filesystem`` JSON source over W files of the events (a split each),
   the event time parsed from the same ISO text, a 2 s bounded-out-of-orderness
   watermark, ``TUMBLE`` + ``COUNT(*)``, a ``filesystem`` JSON sink; the counts are read
   back and checked against the counts computed here. spanflow: the node_throughput
   window pipeline (JetStream in and out), its window counts checked the same way.
2. **keyed running aggregate**: per-device running count and mean of the temperature.
   Flink: ``GROUP BY device`` with ``COUNT(*), AVG(temperature)`` and mini-batches of
   1 s (one update per key and mini-batch, as spanflow's one row per key and batch),
   into a ``blackhole`` sink; its final count per device is checked by a second,
   bounded query. spanflow: the node_throughput keyed pipeline (a Python
   ``KeyedProcessor`` on transformWithState).

Flink runs in its local mini-cluster (``apache-flink`` from PyPI, installed into its
own virtual environment ``benchmarks/.peer-flink-venv`` on first use); its figure is
events / (job end - job start), the job's start-up included, and also without it:
the same job over a one-event input, run first, gives the start-up (planning,
deployment to the mini-cluster, the end-of-input flush), which is subtracted.
spanflow's figure is events/s over the batches after the first, which pays the Python
worker start-up. Flink reads local files and
writes files, spanflow reads and writes a broker: the comparison favours Flink.
Per-event alerts at 10,000 readings/s (latency): ``peer_flink_alerts.py``.

Figures are printed and written to ``benchmarks/results/peer_flink.json``.
Run: ``.venv/bin/python benchmarks/peer_flink.py [--events 1000000] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from node_throughput import keyed_pipeline, measure_throughput, window_pipeline
from peer_bytewax import expected_counts, preload, spanflow_counts, write_files

from spanflow.nats import EmbeddedNats
from spanflow.spark.session import build_session

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FLINK_VENV = HERE / ".peer-flink-venv"
FLINK = "apache-flink==2.2.0"

JOB = r'''
"""The peer's jobs (written by benchmarks/peer_flink.py): python job.py WORKLOAD IN OUT W"""
import json, sys, time
from pyflink.table import EnvironmentSettings, TableEnvironment

workload, folder, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
conf = env.get_config()
conf.set("parallelism.default", str(workers))
conf.set("table.exec.source.idle-timeout", "1 s")
if workload == "keyed":
    conf.set("table.exec.mini-batch.enabled", "true")
    conf.set("table.exec.mini-batch.allow-latency", "1 s")
    conf.set("table.exec.mini-batch.size", "100000")
env.execute_sql(f"""
CREATE TABLE readings (
  device STRING, ts STRING, temperature DOUBLE,
  et AS TO_TIMESTAMP(SUBSTRING(ts, 1, 23), 'yyyy-MM-dd''T''HH:mm:ss.SSS'),
  WATERMARK FOR et AS et - INTERVAL '2' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{folder}', 'format' = 'json')
""")
if workload == "window":
    env.execute_sql(f"""
    CREATE TABLE counts (device STRING, window_start TIMESTAMP(3), n BIGINT)
    WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'json')
    """)
    query = """
    INSERT INTO counts
    SELECT device, window_start, COUNT(*) FROM TABLE(
      TUMBLE(TABLE readings, DESCRIPTOR(et), INTERVAL '10' SECOND))
    WHERE temperature > -50 GROUP BY device, window_start, window_end
    """
else:
    env.execute_sql("""
    CREATE TABLE running_stats (device STRING, n BIGINT, mean DOUBLE)
    WITH ('connector' = 'blackhole')
    """)
    query = """
    INSERT INTO running_stats SELECT device, COUNT(*), AVG(temperature) FROM readings
    WHERE temperature > -50 GROUP BY device
    """
started = time.time()
env.execute_sql(query).wait()
ended = time.time()
check = {}
if workload == "keyed":  # the final count per device, by a bounded query of its own
    batch = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    batch.get_config().set("parallelism.default", str(workers))
    batch.execute_sql(f"""CREATE TABLE readings (device STRING, ts STRING, temperature DOUBLE)
      WITH ('connector' = 'filesystem', 'path' = '{folder}', 'format' = 'json')""")
    with batch.execute_sql("SELECT device, COUNT(*) FROM readings WHERE temperature > -50 "
                           "GROUP BY device").collect() as rows:
        check = {r[0]: r[1] for r in rows}
print(json.dumps({"seconds": ended - started, "check": check}))
'''


def ensure_flink_venv() -> Path:
    python = FLINK_VENV / "bin" / "python"
    probe = [str(python), "-c", "import pyflink.table"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"installing {FLINK} into {FLINK_VENV} (a few minutes, once) …", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(FLINK_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", FLINK], check=True)
    return python


def run_flink(
    python: Path, workload: str, folder: Path, workers: int, work: Path
) -> dict[str, Any]:
    job, out = work / "flink_job.py", work / f"flink-{workload}-{folder.name}"
    job.write_text(JOB)
    done = subprocess.run(
        [str(python), str(job), workload, str(folder), str(out), str(workers)],
        capture_output=True, text=True, timeout=1800, cwd=work,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"flink {workload} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), out=out)


def flink_window_counts(out: Path) -> Counter[tuple[str, int]]:
    counts: Counter[tuple[str, int]] = Counter()
    for part in out.rglob("*"):
        if not part.is_file() or part.name.startswith("."):
            continue
        for line in part.read_bytes().splitlines():
            row = orjson.loads(line)
            start = datetime.fromisoformat(row["window_start"].replace(" ", "T")).replace(
                tzinfo=UTC
            )
            counts[(row["device"], int(start.timestamp()))] += int(row["n"])
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-rows", type=int, default=200_000)
    ap.add_argument("--out", type=Path, default=RESULTS / "peer_flink.json")
    args = ap.parse_args()
    python = ensure_flink_venv()
    work = Path(tempfile.mkdtemp(prefix="spanflow-flink-"))
    expected = expected_counts(args.events)
    per_device = Counter[str]()
    for (device, _), n in expected.items():
        per_device[device] += n
    print(f"writing {args.events:,} events ({args.workers} files) …", flush=True)
    write_files(args.events, args.workers, work / "in")
    write_files(1, 1, work / "tiny")
    os.environ["SPANFLOW_SPARK_MASTER"] = f"local[{args.workers},3]"
    results: dict[str, Any] = {}
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        print(f"pre-loading {args.events:,} events into JetStream …", flush=True)
        asyncio.run(preload(server.url, args.events))
        spark = build_session(app_name="spanflow-peer-flink")
        spark.conf.set("spark.sql.shuffle.partitions", str(args.workers))
        for workload in ("window", "keyed"):
            print(f"flink {workload}, parallelism {args.workers} …", flush=True)
            startup = run_flink(python, workload, work / "tiny", args.workers, work)["seconds"]
            flink = run_flink(python, workload, work / "in", args.workers, work)
            flink_rate = args.events / flink["seconds"]
            busy = flink["seconds"] - startup
            flink_busy_rate = args.events / busy if busy > 0 else None
            if workload == "window":
                exact = flink_window_counts(flink["out"]) == expected
            else:
                exact = flink["check"] == dict(per_device)
            print(f"  {flink_rate:,.0f} events/s ({flink_busy_rate or 0:,.0f} without its "
                  f"{startup:.1f} s start-up), output exact: {exact}", flush=True)  # fmt: skip
            flow = (
                window_pipeline(f"peer-{workload}", "PEER_IN", "PEER_WIN", emit="final",
                                partitions=args.workers, batch_rows=args.batch_rows)
                if workload == "window"
                else keyed_pipeline(f"peer-{workload}", "PEER_IN", "PEER_KEYED",
                                    batch_rows=args.batch_rows)
            )  # fmt: skip
            print(f"spanflow {workload}, local[{args.workers}] …", flush=True)
            ours = measure_throughput(spark, server.url, flow, args.events, work / f"ck-{workload}")
            rate = ours["events_per_s"] or 0
            result: dict[str, Any] = {
                "flink": {"events_per_s": round(flink_rate), "seconds": round(flink["seconds"], 2),
                          "startup_s": round(startup, 2),
                          "events_per_s_without_startup": round(flink_busy_rate or 0),
                          "output_exact": exact},
                "spanflow": ours,
                "ratio_spanflow_over_flink": round(rate / flink_rate, 2) if flink_rate else None,
                "ratio_spanflow_over_flink_without_startup":
                    round(rate / flink_busy_rate, 2) if flink_busy_rate else None,
            }  # fmt: skip
            if workload == "window":
                got = spanflow_counts(server.url)
                wrong = [k for k, v in got.items() if expected.get(k) != v]
                result["spanflow"]["windows_out_exact"] = not wrong and bool(got)
            results[workload] = result
            print(
                f"  spanflow {rate:,} events/s: {result['ratio_spanflow_over_flink']}× Flink, "
                f"{result['ratio_spanflow_over_flink_without_startup']}× without its start-up"
            )
        spark.stop()
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count()},
        "events": args.events,
        "workers": args.workers,
        "flink": FLINK,
        "workloads": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
