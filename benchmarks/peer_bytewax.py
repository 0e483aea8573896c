"""Node throughput against a peer: spanflow and Bytewax 0.21 on the same events, same run.

Both count the same N JSON readings (100 devices, ISO timestamps) per device in 10 s
tumbling event-time windows, after decoding each reading and keeping those with
``temperature > -50`` (all of them), with the same number of workers:

* **spanflow**: one node, ``local[W]`` (W task slots), reading the events from a
  JetStream stream and writing the window counts to another (the node_throughput
  window case); events/s over the batches after the first, which pays the Python
  worker start-up.
* **Bytewax 0.21**, installed into its own virtual environment
  (``benchmarks/.peer-venv``, created on first use): W processes of one worker each
  (``python -m bytewax.run -i <i> -a <addresses>``: processes, not threads, so Python
  runs on W cores as Spark's tasks do), each reading one of W JSON-lines files of the
  events (a partition each), decoding with orjson, filtering, keying by device and
  counting with ``count_window`` over a ``TumblingWindower`` on an ``EventClock``;
  the counts go to a sink that keeps them in memory. Events/s from the first event read
  to the end of the run.

Bytewax reads local files and writes nowhere, spanflow reads and writes a broker: the
comparison favours Bytewax. Both outputs are checked: every window count of both
equals the count computed here from the events.

Figures are printed and written to ``benchmarks/results/peer_bytewax.json``.
Run: ``.venv/bin/python benchmarks/peer_bytewax.py [--events 1000000] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from node_throughput import DEVICES, _outputs, measure_throughput, window_pipeline

from spanflow.nats import EmbeddedNats
from spanflow.nats.streams import connect, ensure_stream
from spanflow.spark.session import build_session

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PEER_VENV = HERE / ".peer-venv"
BYTEWAX = "bytewax==0.21.1"
GOAL_RATIO = 1.5
BASE = 1_800_000_000.0

FLOW = '''
"""The peer's dataflow (written by benchmarks/peer_bytewax.py)."""
import os, time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import orjson
import bytewax.operators as op
import bytewax.operators.windowing as win
from bytewax.connectors.files import DirSource
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition

OUT = Path(os.environ["PEER_OUT"])
ALIGN = datetime(2020, 1, 1, tzinfo=timezone.utc)
ALIGN_S = int(ALIGN.timestamp())


class _Keep(StatelessSinkPartition):
    def __init__(self, worker):
        self.worker, self.rows = worker, []

    def write_batch(self, items):
        self.rows.extend(items)

    def close(self):
        path = OUT / f"out-{os.getpid()}-{self.worker}.json"
        path.write_bytes(orjson.dumps(self.rows))


class KeepSink(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _Keep(worker_index)


def _decode(line):
    (OUT / f"first-{os.getpid()}").touch(exist_ok=True) if not _decode.seen else None
    _decode.seen = True
    return orjson.loads(line)


_decode.seen = False


def _ts(reading):
    return datetime.fromisoformat(reading["ts"])


flow = Dataflow("peer")
lines = op.input("in", flow, DirSource(Path(os.environ["PEER_IN"])))
readings = op.map("decode", lines, _decode)
kept = op.filter("filter", readings, lambda r: r["temperature"] > -50)
clock = win.EventClock(_ts, wait_for_system_duration=timedelta(seconds=2))
windower = win.TumblingWindower(length=timedelta(seconds=10), align_to=ALIGN)
counts = win.count_window("count", kept, clock, windower, lambda r: r["device"])
out = op.map("row", counts.down, lambda kv: (kv[0], ALIGN_S + 10 * kv[1][0], kv[1][1]))
op.output("out", out, KeepSink())
'''


def reading(i: int) -> dict[str, Any]:
    return {
        "device": f"dev-{i % DEVICES:03d}",
        "ts": datetime.fromtimestamp(BASE + i / 1000.0, UTC).isoformat(timespec="milliseconds"),
        "temperature": 20.0 + (i % 170) / 10.0,
    }


def expected_counts(n: int) -> Counter[tuple[str, int]]:
    """(device, window start in epoch seconds) → count, computed from the events."""
    out: Counter[tuple[str, int]] = Counter()
    for i in range(n):
        out[(f"dev-{i % DEVICES:03d}", int((BASE + i / 1000.0) // 10 * 10))] += 1
    return out


def write_files(n: int, workers: int, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    files = [(folder / f"part-{w}.jsonl").open("wb") for w in range(workers)]
    for i in range(n):
        files[i % workers].write(orjson.dumps(reading(i)) + b"\n")
    for f in files:
        f.close()


async def preload(url: str, n: int) -> None:
    nc = await connect(url)
    js = nc.jetstream()
    await ensure_stream(js, "PEER_IN", ["peer.in"])
    pending = []
    for i in range(n):
        pending.append(await js.publish_async("peer.in", orjson.dumps(reading(i))))
        if len(pending) >= 4000:
            await asyncio.wait_for(asyncio.gather(*pending), 60)
            pending = []
    await asyncio.wait_for(asyncio.gather(*pending), 60)
    await nc.close()


def ensure_peer_venv() -> Path:
    python = PEER_VENV / "bin" / "python"
    probe = [str(python), "-c", "import bytewax, orjson"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"installing {BYTEWAX} into {PEER_VENV} …", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", BYTEWAX, "orjson"]
    subprocess.run(pip, check=True)
    return python


def run_bytewax(python: Path, folder: Path, workers: int, work: Path) -> dict[str, Any]:
    out = work / "peer-out"
    out.mkdir()
    (work / "peer_flow.py").write_text(FLOW)
    env = {**os.environ, "PEER_IN": str(folder), "PEER_OUT": str(out)}
    env["PYTHONPATH"] = str(work)
    addresses = ";".join(f"127.0.0.1:{21010 + w}" for w in range(workers))
    started = time.time()
    procs = [
        subprocess.Popen(
            [str(python), "-m", "bytewax.run", "peer_flow:flow", "-w", "1"]
            + (["-i", str(w), "-a", addresses] if workers > 1 else []),
            env=env,
            cwd=work,
        )
        for w in range(workers)
    ]
    codes = [p.wait(1800) for p in procs]
    ended = time.time()
    if any(codes):
        raise RuntimeError(f"bytewax exited with {codes}")
    first = min(p.stat().st_mtime for p in out.glob("first-*"))
    rows = [row for f in out.glob("out-*.json") for row in orjson.loads(f.read_bytes())]
    counts: Counter[tuple[str, int]] = Counter()
    for device, start, n in rows:
        counts[(device, int(start))] += int(n)
    return {"seconds": ended - started, "from_first_event_s": ended - first, "counts": counts}


def spanflow_counts(url: str) -> Counter[tuple[str, int]]:
    out: Counter[tuple[str, int]] = Counter()
    for _, row in asyncio.run(_outputs(url, "PEER_WIN")):
        start = datetime.fromisoformat(row["window_start"].replace("Z", "+00:00"))
        out[(row["device"], int(start.timestamp()))] += int(row["n"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-rows", type=int, default=200_000)
    ap.add_argument("--out", type=Path, default=RESULTS / "peer_bytewax.json")
    args = ap.parse_args()
    python = ensure_peer_venv()
    work = Path(tempfile.mkdtemp(prefix="spanflow-peer-"))
    expected = expected_counts(args.events)
    print(f"writing {args.events:,} events for Bytewax ({args.workers} files) …", flush=True)
    write_files(args.events, args.workers, work / "in")
    print(f"bytewax {BYTEWAX}, {args.workers} processes …", flush=True)
    peer = run_bytewax(python, work / "in", args.workers, work)
    peer_rate = args.events / peer["from_first_event_s"]
    print(f"  {peer_rate:,.0f} events/s ({peer['seconds']:.1f} s in all)", flush=True)
    os.environ["SPANFLOW_SPARK_MASTER"] = f"local[{args.workers},3]"
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        print(f"pre-loading {args.events:,} events into JetStream …", flush=True)
        asyncio.run(preload(server.url, args.events))
        spark = build_session(app_name="spanflow-peer")
        spark.conf.set("spark.sql.shuffle.partitions", str(args.workers))
        flow = window_pipeline(
            "peer-window", "PEER_IN", "PEER_WIN", emit="final", partitions=args.workers,
            batch_rows=args.batch_rows,
        )  # fmt: skip
        print(f"spanflow, local[{args.workers}] …", flush=True)
        ours = measure_throughput(spark, server.url, flow, args.events, work / "ck")
        ours_counts = spanflow_counts(server.url)
        spark.stop()
    rate = ours["events_per_s"] or 0
    ratio = rate / peer_rate if peer_rate else 0.0
    # The run stops once every event is read: the windows of the last batch are not
    # closed yet (its watermark comes with the next). Every window that is out must be
    # exact.
    wrong = [(k, v, expected.get(k)) for k, v in ours_counts.items() if expected.get(k) != v]
    exact = not wrong and bool(ours_counts)
    if wrong:
        print(f"spanflow: {len(wrong)} of {len(ours_counts)} windows differ, e.g. {wrong[:3]}")
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count()},
        "events": args.events,
        "workers": args.workers,
        "bytewax": {
            "version": BYTEWAX,
            "events_per_s": round(peer_rate),
            "seconds": round(peer["seconds"], 2),
            "counts_exact": peer["counts"] == expected,
        },
        "spanflow": {
            **ours,
            "windows_expected": len(expected),
            "windows_out": len(ours_counts),
            "windows_out_exact": exact,
        },
        "ratio_spanflow_over_bytewax": round(ratio, 2),
        "goal_ratio": GOAL_RATIO,
        "met": ratio >= GOAL_RATIO,
    }
    print(f"spanflow {rate:,} events/s, Bytewax {peer_rate:,.0f} events/s: {ratio:.2f}×")
    print(f"counts exact: Bytewax {result['bytewax']['counts_exact']}, "
          f"spanflow {result['spanflow']['windows_out_exact']}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
