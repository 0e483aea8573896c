"""Hot swap under load: ``promotions`` promotions of a registry model while events
flow at ``rate`` per second through a ``score`` step; nothing lost, nothing doubled,
and each swap visible within one micro-batch.

Two ONNX models (scikit-learn logistic regressions, one the other's mirror) are
pushed; the run alternates production between them every ``interval`` seconds.
Each event carries its sequence number; the output must hold each exactly once.
The contract: every micro-batch that *starts* after a promotion is scored by the new
version (checked batch by batch against the versions pinned in SPANFLOW_MODEL_PINS;
the goal is 0 violations). For every promotion, *swap delay* is the time from the
promotion to the first output scored by the new version (outputs timed by their
store time, when their batch was written): the batch running at the promotion
finishes with the version it started with. The baseline, in the same run, is the
query's own batch duration.

Figures are printed and written to ``benchmarks/results/hot_swap.json``.
Run: ``.venv/bin/python benchmarks/hot_swap.py [--rate 2000 --promotions 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import orjson

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from node_throughput import _outputs, progress_of
from skl2onnx import to_onnx
from sklearn.linear_model import LogisticRegression

import spanflow as sf
from spanflow.ml.model_store import ModelStore, with_store
from spanflow.nats import EmbeddedNats
from spanflow.nats.streams import connect, ensure_stream
from spanflow.spark.runner import PipelineRunner
from spanflow.spark.session import build_session

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {"seq": "long", "device": "string", "t": "double", "v": "double"}


def onnx_model(flip: bool) -> bytes:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 2)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0) ^ flip
    return to_onnx(LogisticRegression().fit(x, y), x[:1]).SerializeToString()


def publish(url: str, rate: int, seconds: float, sent: list[int]) -> None:
    async def go() -> None:
        nc = await connect(url)
        js = nc.jetstream()
        rng = np.random.default_rng(4)
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            due = int((time.monotonic() - start) * rate) - n
            futures = []
            for _ in range(max(0, due)):
                t, v = rng.normal(size=2)
                record = {"seq": n, "device": f"d{n % 50}", "t": float(t), "v": float(v)}
                futures.append(await js.publish_async("hs.in", orjson.dumps(record)))
                n += 1
            if futures:
                await asyncio.wait_for(asyncio.gather(*futures), 30)
            await asyncio.sleep(0.005)
        sent.append(n)
        await nc.close()

    asyncio.run(go())


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def _pins(url: str, keys: list[str]) -> dict[str, int | None]:
    """The version pinned for each batch key (see spanflow.ml.scoring)."""
    nc = await connect(url)
    kv = await nc.jetstream().key_value("SPANFLOW_MODEL_PINS")
    out: dict[str, int | None] = {}
    for key in keys:
        try:
            entry = await kv.get(key)
            out[key] = orjson.loads(entry.value or b"{}").get("version")
        except Exception:  # a batch without records pins nothing
            continue
    await nc.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--promotions", type=int, default=10)
    ap.add_argument("--interval", type=float, default=6.0, help="seconds between promotions")
    ap.add_argument("--out", type=Path, default=RESULTS / "hot_swap.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spanflow-hotswap-"))
    seconds = args.interval * (args.promotions + 3)
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        url = server.url

        async def setup(store: ModelStore) -> None:
            await store.push("hs", onnx_model(False), format="onnx", features=["t", "v"])
            await store.push("hs", onnx_model(True), format="onnx", features=["t", "v"])
            await store.promote("hs", 1)

        asyncio.run(with_store(url, setup))

        async def streams() -> None:
            nc = await connect(url)
            await ensure_stream(nc.jetstream(), "HS_IN", ["hs.in"])
            await nc.close()

        asyncio.run(streams())
        spark = build_session(app_name="spanflow-hot-swap")
        p = sf.Pipeline("hot-swap", trigger="500ms")
        flow = (
            p.source("HS_IN", schema=SCHEMA, key="device")
            .score("hs", prediction_type="boolean")
            .sink_jetstream("HS_OUT", subject="hs.out")
        )
        runner = PipelineRunner(
            spark, flow.spec(), nats_url=url, checkpoint_dir=str(work / "ck"), functions={}
        ).start()
        sent: list[int] = []
        publisher = threading.Thread(target=publish, args=(url, args.rate, seconds, sent))
        publisher.start()
        started: dict[int, float] = {}  # batch id → when its trigger fired
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                for q in progress_of(runner):
                    started[int(q["batchId"])] = _seconds(q["timestamp"])
                time.sleep(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        promotions: list[tuple[float, int]] = []
        time.sleep(2 * args.interval)  # the query's start-up backlog is worked off first
        for i in range(args.promotions):
            version = 2 if i % 2 == 0 else 1
            asyncio.run(with_store(url, lambda store, v=version: store.promote("hs", v)))
            promotions.append((time.time(), version))
            print(f"promoted version {version}", flush=True)
            time.sleep(args.interval)
        publisher.join()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = sum(int(q["numInputRows"]) for q in progress_of(runner))
            if done >= sent[0]:
                break
            time.sleep(0.5)
        batches = [float(q["durationMs"]["triggerExecution"]) for q in progress_of(runner)]
        watching.set()
        watcher.join()
        runner.stop()
        outputs = asyncio.run(_outputs(url, "HS_OUT"))
        step = flow.spec().steps[1].id
        pinned = asyncio.run(_pins(url, [f"hot-swap.{step}.production.{b}" for b in started]))
        spark.stop()
    seqs = [o["seq"] for _, o in outputs]
    lost = sent[0] - len(set(seqs))
    duplicated = len(seqs) - len(set(seqs))
    batch_p50 = statistics.median(batches) / 1000
    delays = []
    for k, (at, version) in enumerate(promotions):
        until = promotions[k + 1][0] if k + 1 < len(promotions) else float("inf")
        # When each event was scored: its output's store time (the batch's commit)
        stamped = [(us / 1e6, o["model_version"]) for us, o in outputs]
        window = [(t, v) for t, v in stamped if at <= t < until]
        first_new = min((t for t, v in window if v == version), default=None)
        if first_new is not None:
            delays.append(first_new - at)
    # The contract: a batch that starts after a promotion is scored by the new version
    late_batches = 0
    for batch, at_start in started.items():
        current = [v for at, v in promotions if at < at_start]
        version = pinned.get(f"hot-swap.{step}.production.{batch}")
        if current and version is not None and version != current[-1]:
            late_batches += 1
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "rate": args.rate,
        "promotions": args.promotions,
        "events": sent[0],
        "lost": lost,
        "duplicated": duplicated,
        "batch_ms_p50": round(batch_p50 * 1000),
        "swap_delay_s": {
            "max": round(max(delays), 3),
            "median": round(statistics.median(delays), 3),
        }
        if delays
        else None,
        "batches": len(started),
        "batches_started_after_a_promotion_with_the_old_version": late_batches,
        "swaps_seen": len(delays),
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
