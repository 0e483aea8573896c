"""Event patterns on one node: throughput with 1, 10 and 100 patterns per key, the
latency a pattern step adds over a plain filter, and a live rule change under load —
all in one run, against baselines measured in the same run.

Workload: 100 devices; temperature mostly 55-75 with 2 % spikes above 80, pressure
mostly 4-6 with 5 % drops below 2. Pattern *i* (of k) is
``hot: temperature > 80 + i·(10/k)`` followed by ``drop: pressure < 1.5 + i·(0.5/k)``
within 30 s — k distinct rules per key, as a rule set of many alerts would be.

1. **Throughput**: N events pre-loaded; each case reads them through a keyed
   ``match`` with k rules (k = 1, 10, 100), output filtered away (so the figures are
   of the step, not the sink); baseline: a keyed processor keeping a running mean.
   Events/s over the batches after the first.
2. **Added latency** at ``--rate`` events/s: publish → visible (both JetStream store
   times) for a filter → sink pipeline and for ``match`` with 10 rules → sink (each
   match row carries its last event's publish time). A match is emitted when the
   watermark passes its last event, i.e. one micro-batch after it arrived: that wait
   is part of the figure.
3. **Live rule change** at ``--rate`` events/s: a rule set of 10 rules; after
   ``--change-after`` seconds version 2 replaces one rule and keeps nine. The nine
   unchanged rules' matches must equal the NFA's over every published event: lost
   and duplicated matches are counted.

Figures are printed and written to ``benchmarks/results/cep_throughput.json``.
Run: ``.venv/bin/python benchmarks/cep_throughput.py [--events 400000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from node_throughput import (
    RunningMean,
    _iso_us,
    _outputs,
    ensure,
    latency_run,
    measure_throughput,
    publish_at_rate,
)

import spanflow as sf
from spanflow.cep.nfa import NFA
from spanflow.cep.rule_store import with_store
from spanflow.nats import EmbeddedNats
from spanflow.nats.streams import connect, ensure_stream
from spanflow.spark.runner import PipelineRunner
from spanflow.spark.session import build_session
from spanflow.spec.patterns import RuleSpec

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {
    "device": "string",
    "ts": "timestamp",
    "temperature": "double",
    "pressure": "double",
}
DEVICES = 100
GOAL = 20_000


def pattern(i: int, k: int) -> sf.Pattern:
    return (
        sf.Pattern.begin("hot").where(f"temperature > {80 + i * 10 / k:.3f}")
        .followed_by("drop").where(f"pressure < {1.5 + i * 0.5 / k:.3f}")
        .within("30s")
    )  # fmt: skip


def rules(k: int, select: dict[str, str] | None = None) -> list[RuleSpec]:
    return [pattern(i, k).rule(f"r{i}", select=select) for i in range(k)]


def value(rng: random.Random) -> tuple[float, float]:
    temperature = 85.0 + rng.random() * 10 if rng.random() < 0.02 else 55 + rng.random() * 20
    pressure = 1.0 + rng.random() if rng.random() < 0.05 else 4.0 + rng.random() * 2
    return round(temperature, 2), round(pressure, 2)


async def preload(url: str, stream: str, subject: str, n: int) -> None:
    nc = await connect(url)
    js = nc.jetstream()
    await ensure_stream(js, stream, [subject])
    rng = random.Random(7)
    base = 1_800_000_000.0
    futures = []
    for i in range(n):
        t, p = value(rng)
        ts = datetime.fromtimestamp(base + i / 100.0, UTC).isoformat(timespec="milliseconds")
        record = {"device": f"dev-{i % DEVICES:03d}", "ts": ts, "temperature": t, "pressure": p}
        futures.append(await js.publish_async(subject, orjson.dumps(record)))
        if len(futures) >= 4000:
            await asyncio.wait_for(asyncio.gather(*futures), 60)
            futures = []
    await asyncio.wait_for(asyncio.gather(*futures), 60)
    await nc.close()


def throughput_flows(batch_rows: int, ks: list[int]) -> dict[str, sf.Flow]:
    def keyed(name: str) -> sf.Stream:
        p = sf.Pipeline(f"cep-{name}", trigger=0)
        src = p.source(
            "CEP_IN", schema=SCHEMA, event_time="ts", max_rows_per_batch=batch_rows, partitions=2
        )
        return src.key_by("device")

    flows = {
        "keyed_baseline": keyed("base")
        .process(RunningMean, output_schema={"device": "string", "n": "long", "mean": "double"})
        .sink_jetstream("CEP_BASE", subject="cep.base")
    }
    for k in ks:
        flows[f"patterns_{k}"] = (
            keyed(f"k{k}")
            .match(rules=rules(k))
            .filter("rule = 'none'")  # keeps nothing: the step, not the sink
            .sink_jetstream(f"CEP_K{k}", subject=f"cep.k{k}")
        )
    return flows


# -- 2. latency ------------------------------------------------------------------------
_rng = random.Random(11)


def live_reading(n: int) -> dict[str, Any]:
    t, p = value(_rng)
    now = datetime.now(UTC).isoformat(timespec="milliseconds")
    return {"device": f"dev-{n % DEVICES:03d}", "ts": now, "temperature": t, "pressure": p}


def latency_flows() -> dict[str, sf.Flow]:
    def head(name: str) -> sf.Stream:
        p = sf.Pipeline(f"lat-{name}", trigger=0)
        return p.source("CEP_LAT", schema=SCHEMA, event_time="ts", start="latest").map(
            published="_published"
        )

    return {
        "filter": head("filter")
        .filter("temperature > -50")
        .sink_jetstream("LAT_FILTER", subject="lat.filter"),
        "patterns_10": head("k10")
        .key_by("device")
        .match(rules=rules(10, select={"published": "last(drop.published)"}))
        .sink_jetstream("LAT_K10", subject="lat.k10"),
    }


# -- 3. live rule change ------------------------------------------------------------------
def rule_change(
    spark: Any, url: str, rate: int, seconds: float, change_after: float, work: Path
) -> dict[str, Any]:
    v1 = rules(10)
    replaced = sf.Pattern.begin("cold").where("temperature < 56").rule("r9")
    v2 = [*v1[:9], replaced]
    asyncio.run(with_store(url, lambda store: store.push("bench-rules", v1)))
    flow = (
        sf.Pipeline("cep-live", trigger=0)
        .source("CEP_LIVE", schema=SCHEMA, event_time="ts", start="latest")
        .key_by("device")
        .match(rule_set="bench-rules")
        .sink_jetstream("LIVE_OUT", subject="live.out")
    )
    runner = PipelineRunner(spark, flow.spec(), nats_url=url, checkpoint_dir=str(work)).start()
    time.sleep(5)  # the query is up before the first event (start="latest")
    publisher = threading.Thread(
        target=publish_at_rate,
        args=(url, "cep.live", rate, seconds, threading.Event(), live_reading),
    )
    publisher.start()
    time.sleep(change_after)  # a fixed moment in the run, not a synchronisation
    asyncio.run(with_store(url, lambda store: store.push("bench-rules", v2)))
    changed_at = time.time()
    publisher.join()
    flush = {"device": "flush", "ts": datetime.now(UTC).replace(year=2099).isoformat(),
             "temperature": 0.0, "pressure": 9.0}  # fmt: skip

    async def send_flush() -> None:
        nc = await connect(url)
        await nc.jetstream().publish("cep.live", orjson.dumps(flush))
        await nc.close()

    asyncio.run(send_flush())
    time.sleep(2)
    runner.await_idle()
    runner.stop()
    inputs = [row for _, row in asyncio.run(_outputs(url, "CEP_LIVE"))]
    rows = [row for _, row in asyncio.run(_outputs(url, "LIVE_OUT"))]
    expected: Counter[tuple[str, str, int]] = Counter()
    for rule in v1[:9]:
        expected.update(_nfa_matches(rule, inputs))
    got = Counter(
        (r["rule"], r["device"], _iso_us(r["match_start"]) // 1000)
        for r in rows
        if r["rule"] != "r9"
    )
    lost = sum((expected - got).values())
    duplicated = sum((got - expected).values())
    versions = Counter((r["rule"] == "r9", r["version"]) for r in rows)
    return {
        "events": len(inputs) - 1,
        "rate": rate,
        "changed_after_s": change_after,
        "changed_at": datetime.fromtimestamp(changed_at, UTC).isoformat(timespec="seconds"),
        "unchanged_rule_matches_expected": sum(expected.values()),
        "lost": lost,
        "duplicated": duplicated,
        "rows_by_version": {
            f"{'changed' if c else 'unchanged'} rule, v{v}": n
            for (c, v), n in sorted(versions.items())
        },
    }


def _nfa_matches(rule: RuleSpec, inputs: list[dict[str, Any]]) -> Counter[tuple[str, str, int]]:
    """(rule, device, match start in ms) of every match of ``rule``."""
    nfa = NFA(rule.pattern)
    by_device: dict[str, list[dict[str, Any]]] = {}
    for row in inputs:
        by_device.setdefault(row["device"], []).append(row)
    end = max(_iso_us(r["ts"]) // 1000 for r in inputs)
    out: Counter[tuple[str, str, int]] = Counter()
    for device, events in by_device.items():
        state = nfa.initial_state()
        found = []
        for e in sorted(events, key=lambda r: _iso_us(r["ts"])):
            ms = _iso_us(e["ts"]) // 1000
            found += nfa.advance_time(state, ms)[0] + nfa.process(state, e, ms)
        found += nfa.advance_time(state, end)[0]
        out.update((rule.name, device, m.start_ts) for m in found)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--batch-rows", type=int, default=100_000)
    ap.add_argument("--patterns", default="1,10,100", help="patterns per key, comma-separated")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--change-after", type=float, default=10.0)
    ap.add_argument("--skip", default="", help="parts to skip: throughput,latency,rules")
    ap.add_argument("--out", type=Path, default=RESULTS / "cep_throughput.json")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    ks = [int(k) for k in args.patterns.split(",")]
    work = Path(tempfile.mkdtemp(prefix="spanflow-cep-bench-"))
    out: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count()},
    }
    with EmbeddedNats(work / "nats", sync_always=False) as server:
        url = server.url
        spark = build_session(app_name="spanflow-cep-bench")
        if "throughput" not in skip:
            print(f"pre-loading {args.events:,} events …", flush=True)
            asyncio.run(preload(url, "CEP_IN", "cep.in", args.events))
            results = {}
            for case, flow in throughput_flows(args.batch_rows, ks).items():
                print(f"{case} …", flush=True)
                results[case] = measure_throughput(spark, url, flow, args.events, work / case)
                print(f"  {results[case]['events_per_s']:,} events/s", flush=True)
            out["throughput"] = results
            out["events"] = args.events
        if "latency" not in skip:
            asyncio.run(ensure(url, "CEP_LAT", "cep.lat"))
            latency = {}
            for case, flow in latency_flows().items():
                print(f"latency of {case} at {args.rate:,} events/s …", flush=True)
                latency[case] = latency_run(
                    spark, url, flow, "cep.lat", args.rate, args.seconds, args.warmup,
                    work / f"lat-{case}", make=live_reading,
                )  # fmt: skip
                ms = latency[case]["latency_ms"]
                print(f"  p50 {ms['p50']:.0f} ms, p99 {ms['p99']:.0f} ms", flush=True)
                print(f"  batch profile (mean ms): {latency[case]['profile']}", flush=True)
            base = latency["filter"]["latency_ms"]
            out["latency"] = latency
            out["added_latency_ms"] = {
                q: round(latency["patterns_10"]["latency_ms"][q] - base[q], 1)
                for q in ("p50", "p95", "p99")
            }
        if "rules" not in skip:
            asyncio.run(ensure(url, "CEP_LIVE", "cep.live"))
            print(f"live rule change at {args.rate:,} events/s …", flush=True)
            out["rule_change"] = rule_change(
                spark, url, args.rate, args.seconds + args.warmup, args.change_after, work / "live"
            )
            print(json.dumps(out["rule_change"], indent=2), flush=True)
        spark.stop()
    if "throughput" in out:
        tput = out["throughput"]
        out["targets"] = {
            "patterns_10_events_per_s_at_least": GOAL,
            "met": bool((tput.get("patterns_10", {}).get("events_per_s") or 0) >= GOAL),
        }
        print(f"{'case':16} {'events/s':>10}")
        for case, r in tput.items():
            print(f"{case:16} {r['events_per_s'] or 0:>10,}")
    if skip:
        args.out = args.out.with_name("cep_throughput_partial.json")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
