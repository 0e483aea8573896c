"""How long a node is blind after it starts: process start → first output per kind.

One NATS server; readings of 20 devices (10 % hot) published at 200/s for the whole
run by a thread here. ``spanflow run`` (a node in its own process) runs one pipeline
with three sinks:

* ``alerts``: hot readings, in Spark's Real-Time Mode;
* ``events``: every reading through a filter, micro-batches;
* ``means``: a keyed processor (running mean per device), micro-batches.

Measured from just before the process is spawned to the first output of each sink
being stored in JetStream (wall clock against the server's store time, one machine),
first on an empty data directory (cold: no checkpoint), then ``--restarts`` times
after SIGKILLing the whole process tree and starting it again on the same directory
(warm: the queries resume from their checkpoints, as a restarted edge node does).

Two variants, interleaved run by run: with Spark's class archive
(``spanflow.spark.jvm.class_archive``, made first if missing) and without it
(``SPANFLOW_SPARK_CLASS_ARCHIVE=0``, the baseline: sessions as they started before).

Figures are printed and written to ``benchmarks/results/start_time.json``.
Run: ``.venv/bin/python benchmarks/start_time.py [--restarts 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from nats.js.errors import NotFoundError

from spanflow.nats import EmbeddedNats
from spanflow.nats.streams import connect, ensure_stream
from spanflow.spark.jvm import class_archive

RESULTS = Path(__file__).resolve().parent / "results"
SINKS = ("alerts", "events", "means")
GOALS_S = {"alerts": 10.0, "events": 20.0, "means": 20.0}

PIPELINE = """
name: start-time
trigger: 0s
sources:
  - id: readings
    stream: ST_IN
    schema: {device: string, ts: timestamp, temperature: double}
    key: device
    start: latest
    to: [hot, ok, mean]
processors:
  - {id: hot, type: filter, where: "temperature > 80", to: [alerts]}
  - {id: ok, type: filter, where: "temperature > -50", to: [events]}
  - id: mean
    type: process
    processor: node_throughput:RunningMean
    output_schema: {device: string, n: long, mean: double}
    to: [means]
sinks:
  - {id: alerts, type: jetstream, stream: ST_ALERTS, subject: st.alerts, mode: realtime}
  - {id: events, type: jetstream, stream: ST_EVENTS, subject: st.events}
  - {id: means, type: jetstream, stream: ST_MEANS, subject: st.means}
"""


def publish_forever(url: str, stop: threading.Event, rate: int = 200) -> None:
    async def run() -> None:
        nc = await connect(url)
        js = nc.jetstream()
        await ensure_stream(js, "ST_IN", ["st.in"])
        n, start = 0, time.monotonic()
        while not stop.is_set():
            due = start + n / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            reading = {
                "device": f"d{n % 20}",
                "ts": datetime.now(UTC).isoformat(),
                "temperature": 90.0 if n % 10 == 0 else 50.0,
            }
            await js.publish("st.in", orjson.dumps(reading))
            n += 1
        await nc.close()

    asyncio.run(run())


async def _first_stored(url: str, stream: str) -> float | None:
    """The store time (epoch s) of the stream's first message, None when empty."""
    nc = await connect(url)
    js = nc.jetstream()
    try:
        info = await js.stream_info(stream)
        if not info.state.messages:
            return None
        first = info.state.first_seq
        msg = await js.get_msg(stream, first)
        assert msg.time is not None
        return msg.time.timestamp() if hasattr(msg.time, "timestamp") else float(msg.time)
    except Exception:
        return None
    finally:
        await nc.close()


async def _purge(url: str) -> None:
    """Empty the sinks between runs: delete them (spanflow's streams refuse a purge);
    the next run's sinks make them again."""
    nc = await connect(url)
    js = nc.jetstream()
    for sink in ("ST_ALERTS", "ST_EVENTS", "ST_MEANS"):
        with contextlib.suppress(NotFoundError):  # not created yet
            await js.delete_stream(sink)
    await nc.close()


def first_outputs(url: str, started: float, timeout: float = 180.0) -> dict[str, float]:
    """Seconds from ``started`` to each sink's first stored output."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(SINKS) and time.monotonic() < deadline:
        for sink in SINKS:
            if sink not in seen:
                stored = asyncio.run(_first_stored(url, f"ST_{sink.upper()}"))
                if stored is not None:
                    seen[sink] = round(stored - started, 2)
        time.sleep(0.2)
    return seen


VARIANTS: dict[str, dict[str, str]] = {
    "class archive": {},
    "no class archive (baseline)": {class_archive.ENV: "0"},
}


def spawn(
    pipeline: Path, url: str, data: Path, log: Path, extra: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent), **extra}
    return subprocess.Popen(
        [sys.executable, "-m", "spanflow.cli", "run", str(pipeline), "--nats", url,
         "--data-dir", str(data)],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True, env=env,
    )  # fmt: skip


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _medians(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    restarts = [r for r in runs if r["kind"] == "restart"]
    return {
        s: statistics.median(r[s] for r in restarts if s in r) if restarts else None for s in SINKS
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "start_time.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spanflow-start-"))
    pipeline = work / "pipeline.yaml"
    pipeline.write_text(PIPELINE)
    if class_archive.ensure() is None:
        print("no class archive could be made: both variants run without one")
    runs: list[dict[str, Any]] = []
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        stop = threading.Event()
        feeder = threading.Thread(target=publish_forever, args=(server.url, stop), daemon=True)
        feeder.start()
        try:
            for i in range(args.restarts + 1):
                kind = "cold" if i == 0 else "restart"
                for n, (variant, extra) in enumerate(VARIANTS.items()):
                    asyncio.run(_purge(server.url))
                    started = time.time()
                    data = work / f"node-{n}"
                    proc = spawn(pipeline, server.url, data, work / "run.log", extra)
                    try:
                        seen = first_outputs(server.url, started)
                    finally:
                        kill_tree(proc)
                    runs.append({"variant": variant, "kind": kind, **seen})
                    print(
                        f"{variant}, {kind}: "
                        + ", ".join(f"{k} {v:.1f} s" for k, v in seen.items())
                    )
        finally:
            stop.set()
            feeder.join(10)
    medians = {
        variant: _medians([r for r in runs if r["variant"] == variant]) for variant in VARIANTS
    }
    main_medians = medians["class archive"]
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count()},
        "runs": runs,
        "restart_median_s": main_medians,
        "restart_median_s_by_variant": medians,
        "goals_s": GOALS_S,
        "met": {
            s: main_medians[s] is not None and main_medians[s] <= g for s, g in GOALS_S.items()
        },
    }
    for variant, values in medians.items():
        print(
            f"{variant}, restart → first output, median: "
            + ", ".join(f"{k} {v} s" for k, v in values.items())
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
