"""Per-event alerts at 10,000 readings/s: Apache Flink and spanflow's Real-Time Mode, one run.

The latency workload of ``realtime_latency.py`` (filter ``temp > 45`` → the alert
stored), run by Flink and then by spanflow, one after the other in the same run, on the
same cores, at the same rate (10 % of the readings are hot):

- **Flink**: PyFlink's Table API (Flink SQL, what a PyFlink user writes) reading a
  Kafka topic and writing alerts to another (Flink's own Kafka connector,
  ``flink-sql-connector-kafka`` 5.0.0-2.2 from Maven Central; Apache Kafka 4.1 on one
  KRaft node, ``spanflow.local.kafka_broker``). Both topics stamp records with the
  broker's clock (``LogAppendTime``), so a reading's latency is its alert's append time
  minus its own, in milliseconds (Kafka's resolution). The sink is at-least-once: an
  exactly-once Kafka sink makes alerts visible to ``read_committed`` readers only at
  Flink's checkpoints (seconds), which would measure the checkpoint interval.
- **spanflow**: ``realtime_latency.run_one`` in Real-Time Mode — JetStream in and out,
  the alert pipeline beside a per-key window pipeline (the same query as
  ``realtime_latency.py``: spanflow does more work), the sink exactly once by message
  id. Latency: the reading stored in JetStream → its alert stored, on the server's
  clock, in microseconds.

Both figures run from a reading stored in the broker to its alert stored in the broker;
the brokers differ (Kafka for Flink, which has no NATS connector; JetStream for
spanflow). Readings in the first ``--warmup`` seconds are left out (Flink's job is
running before they start: probe readings are sent until one comes out as an alert).

Figures are printed and written to ``benchmarks/results/peer_flink_alerts.json``.
Run: ``.venv/bin/python benchmarks/peer_flink_alerts.py [--rate 10000] [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_flink import FLINK, ensure_flink_venv
from realtime_latency import DEVICES, HOT, run_one, summary

from spanflow.local.kafka_broker import LocalKafka
from spanflow.maven import Artifacts, classpath
from spanflow.nats import EmbeddedNats
from spanflow.spark.session import build_session

RESULTS = Path(__file__).resolve().parent / "results"
FLINK_KAFKA = Artifacts("flink-kafka", ("org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2",))

JOB = r'''
"""Flink's alert job (written by benchmarks/peer_flink_alerts.py): job.py BOOTSTRAP IN OUT JARS"""
import sys
from pyflink.table import EnvironmentSettings, TableEnvironment

bootstrap, source, sink, jars = sys.argv[1:5]
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
conf = env.get_config()
conf.set("pipeline.jars", ";".join("file://" + j for j in jars.split(":")))
conf.set("parallelism.default", "1")
env.execute_sql(f"""
CREATE TABLE readings (id BIGINT, device STRING, temp DOUBLE) WITH (
  'connector' = 'kafka', 'topic' = '{source}', 'properties.bootstrap.servers' = '{bootstrap}',
  'properties.group.id' = 'peer-flink', 'scan.startup.mode' = 'earliest-offset',
  'format' = 'json')""")
env.execute_sql(f"""
CREATE TABLE alerts (id BIGINT, device STRING, temp DOUBLE) WITH (
  'connector' = 'kafka', 'topic' = '{sink}', 'properties.bootstrap.servers' = '{bootstrap}',
  'sink.delivery-guarantee' = 'at-least-once', 'properties.linger.ms' = '0',
  'format' = 'json')""")
query = f"INSERT INTO alerts SELECT id, device, temp FROM readings WHERE temp > {HOT}"
env.execute_sql(query).wait()  # an unbounded source: runs until killed
'''.replace("{HOT}", str(HOT))


def reading(n: int) -> bytes:
    """Reading ``n``: every tenth one hot, as realtime_latency's publisher sends them."""
    temp = 50.0 if n % 10 == 3 else 20.0 + n % 7
    return orjson.dumps({"id": n, "device": f"dev-{n % DEVICES:02d}", "temp": temp})


def create_topics(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"message.timestamp.type": "LogAppendTime"}
    new = [NewTopic(t, num_partitions=1, config=config) for t in topics]
    for future in admin.create_topics(new).values():
        future.result(30)


def produce_at_rate(bootstrap: str, topic: str, rate: int, seconds: float) -> int:
    """Produce at ``rate``/s for ``seconds`` from a process of its own, in 1 ms steps."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return int(pool.apply(_produce, (bootstrap, topic, rate, seconds)))


def _produce(bootstrap: str, topic: str, rate: int, seconds: float) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    start = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - start) < seconds:
        for _ in range(int(elapsed * rate) - sent):
            producer.produce(topic, reading(sent))
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    assert producer.flush(30) == 0
    return sent


def read_all(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """(id, append time in ms) of every record of a one-partition topic."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"r-{time.monotonic_ns()}",
         "enable.auto.commit": False, "enable.partition.eof": True}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, int]] = []
    try:
        while True:
            batch = consumer.consume(5000, timeout=5)
            if not batch:
                return out
            for m in batch:
                if m.error():
                    if m.error().code() == -191:  # _PARTITION_EOF
                        return out
                    raise RuntimeError(str(m.error()))
                out.append((int(orjson.loads(m.value())["id"]), m.timestamp()[1]))
    finally:
        consumer.close()


def wait_until_live(bootstrap: str, source: str, sink: str, job: subprocess.Popen[str]) -> float:
    """Send hot probe readings (negative ids) until Flink's first alert; seconds taken."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    began = time.monotonic()
    probe = -1
    while time.monotonic() - began < 300:
        if job.poll() is not None:
            raise RuntimeError(
                f"flink's job ended: {job.stderr.read()[-3000:] if job.stderr else ''}"
            )
        producer.produce(source, orjson.dumps({"id": probe, "device": "probe", "temp": 99.0}))
        producer.flush(5)
        probe -= 1
        if read_all(bootstrap, sink):
            return time.monotonic() - began
        time.sleep(0.5)
    raise RuntimeError("flink's job gave no alert within 300 s")


def run_flink(rate: int, seconds: float, warmup: float, work: Path) -> dict[str, Any]:
    python = ensure_flink_venv()
    jars = ":".join(str(j) for j in classpath(FLINK_KAFKA))
    with LocalKafka(brokers=1, log_dir=work) as kafka:
        create_topics(kafka.bootstrap, "readings", "alerts")
        (work / "alerts_job.py").write_text(JOB)
        job = subprocess.Popen(
            [str(python), str(work / "alerts_job.py"), kafka.bootstrap, "readings", "alerts", jars],
            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            startup = wait_until_live(kafka.bootstrap, "readings", "alerts", job)
            print(f"  flink's job live after {startup:.1f} s", flush=True)
            sent = produce_at_rate(kafka.bootstrap, "readings", rate, warmup + seconds)
            expected = sum(1 for n in range(sent) if n % 10 == 3)
            deadline = time.monotonic() + 120
            alerts = read_all(kafka.bootstrap, "alerts")
            while sum(1 for i, _ in alerts if i >= 0) < expected and time.monotonic() < deadline:
                time.sleep(1)
                alerts = read_all(kafka.bootstrap, "alerts")
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        readings = dict(r for r in read_all(kafka.bootstrap, "readings") if r[0] >= 0)
    since_ms = min(readings.values()) + int(warmup * 1000)
    latencies = [float(ms - readings[i]) for i, ms in alerts if i >= 0 and readings[i] >= since_ms]
    return {
        "sent": sent,
        "alerts": sum(1 for i, _ in alerts if i >= 0),
        "expected_alerts": expected,
        "alert_ms": summary(latencies),
        "startup_s": round(startup, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "peer_flink_alerts.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spanflow-flink-alerts-"))
    print(f"flink: alerts at {args.rate:,}/s for {args.seconds:g} s …", flush=True)
    flink = run_flink(args.rate, args.seconds, args.warmup, work)
    print(f"  {flink['alerts']:,} of {flink['expected_alerts']:,} alerts, "
          f"ms {flink['alert_ms']}", flush=True)  # fmt: skip
    print(f"spanflow (Real-Time Mode): alerts at {args.rate:,}/s …", flush=True)
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        spark = build_session(app_name="spanflow-peer-flink-alerts", realtime_slots=4)
        ours = run_one(spark, server.url, work, "realtime", args.rate, args.seconds, args.warmup)
        spark.stop()
    print(f"  {ours['alerts']:,} of {ours['expected_alerts']:,} alerts, "
          f"ms {ours['alert_ms']}", flush=True)  # fmt: skip
    ratios = {
        q: round(flink["alert_ms"][q] / ours["alert_ms"][q], 1)
        for q in ("p50", "p95", "p99")
        if ours["alert_ms"].get(q)
    }
    print(f"Flink's latency over spanflow's: {ratios}")
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count()},
        "rate": args.rate,
        "seconds": args.seconds,
        "flink": {"version": FLINK, "broker": "Apache Kafka 4.1.1", **flink},
        "spanflow": {"mode": "realtime", "broker": "NATS JetStream", **ours},
        "flink_latency_over_spanflow": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
