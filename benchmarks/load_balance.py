"""Load balancing: the same overload with no balancing, peer-to-peer shedding only, and
peer-to-peer shedding plus the central rebalancer — same machine, same run.

The overload: node g1 (1 core, one Spark task thread) starts alone and gets two
pipelines — ``busy`` (priority 5, pinned to g1 by a tag, fed ``--rate`` readings/s)
and ``light`` (priority 0, ``--light-rate`` readings/s); either alone fits g1, both
do not. Then g2 and g3 join the same site and, once their Spark sessions are up, the
readings start. For ``--seconds`` the benchmark
records every output's latency (its JetStream store time minus the reading's publish
time), g1's reported lag on ``busy`` once a second, and the moves in the control log.
At the end ``light``'s output is checked: every reading exactly once, whatever moved.

Each node's processes are pinned to a CPU (g1 on CPU 0, g2 and g3 on CPU 1, with
``taskset``) so that, as on separate machines, moving a fragment off g1 frees CPU for
what stays; unpinned, every node shares both cores and a move frees nothing.

Modes (agents' ``--shed-*`` and the coordinator's ``--rebalance`` options):

* ``none`` — agents do not shed, the coordinator does not rebalance (the baseline);
* ``p2p`` — agents shed (high 0.7, low 0.6, sustain 5 s), no central rebalancer;
* ``p2p+central`` — both (the rebalancer acts on nodes overloaded for 20 s);
* ``central`` — the rebalancer alone (agents do not shed), for comparison.

Run: ``.venv/bin/python benchmarks/load_balance.py [--seconds 120] [--rate 800]
[--light-rate 800] [--modes none,p2p,p2p+central,central]``. Figures go to
``benchmarks/results/load_balance.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psutil

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from spanflow.local.cluster import Api, LocalCluster
from spanflow.nats.ranges import read_range
from spanflow.nats.streams import connect, ensure_stream
from spanflow.testing.streams import stored

RESULTS = Path(__file__).resolve().parent / "results"
PINNED = (os.cpu_count() or 1) >= 2
"""g1 on CPU 0, g2 and g3 on CPU 1 (NATS, the coordinator and the publishers float)."""

TOPOLOGY = """\
sites: [{name: plant, kind: cloud}]
nodes:
  - {name: g1, site: plant, local: true, capabilities: {cores: 1, slots: 2, tags: [big]}}
  - {name: g2, site: plant, capabilities: {cores: 1, slots: 2}}
  - {name: g3, site: plant, capabilities: {cores: 1, slots: 2}}
"""
PIPELINE = """\
name: {name}
trigger: 0.5s
sources:
  - {{id: src, stream: {stream}, subjects: ["{prefix}.>"],
     schema: {{device: string, id: long, sent: long}}, to: [keep]}}
processors:
  - {{id: keep, type: filter, where: "id >= 0", to: [out]{pin}}}
sinks:
  - {{id: out, type: jetstream, stream: {stream}_OUT, subject: "{prefix}out.x"}}
"""
SHED = ["--shed-high", "0.7", "--shed-low", "0.6", "--shed-sustain", "5"]
MODES: dict[str, tuple[list[str], list[str]]] = {
    "none": (["--no-shed"], ["--no-rebalance"]),
    "p2p": (SHED, ["--no-rebalance"]),
    "p2p+central": (SHED, []),
    "central": (["--no-shed"], []),
}


class Publisher:
    """``rate`` readings a second to ``<prefix>.<device>``, each with its publish time
    (ms) and a message id; runs on its own thread until stopped."""

    def __init__(self, url: str, stream: str, prefix: str, rate: float) -> None:
        self.url, self.stream, self.prefix, self.rate = url, stream, prefix, rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        nc = await connect(self.url)
        js = nc.jetstream()
        await ensure_stream(js, self.stream, [f"{self.prefix}.>"])
        start = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - start) * self.rate)
            acks = []
            while self.sent < due:
                i = self.sent
                body = {"device": f"d{i % 8}", "id": i, "sent": int(time.time() * 1000)}
                acks.append(
                    await js.publish_async(
                        f"{self.prefix}.d{i % 8}",
                        orjson.dumps(body),
                        headers={"Nats-Msg-Id": f"{self.prefix}-{i}"},
                    )
                )
                self.sent += 1
            if acks:
                await asyncio.gather(*acks)
            await asyncio.sleep(0.01)
        await nc.close()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        return self.sent


async def _latencies(url: str, stream: str) -> list[tuple[int, float, float]]:
    """(id, store time, latency s) of every reading in ``stream``: JetStream's store
    time minus the reading's publish time."""
    nc = await connect(url)
    try:
        last = (await nc.jetstream().stream_info(stream)).state.last_seq
        messages = await read_range(nc, stream, 1, last + 1)
    finally:
        await nc.close()
    out = []
    for msg in messages:
        body = orjson.loads(msg.data)
        if body.get("id", -1) >= 0:
            stored = msg.published_us / 1e6
            out.append((int(body["id"]), stored, stored - body["sent"] / 1000))
    return out


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"n": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 3)}


def run_mode(mode: str, seconds: float, rate: float, light_rate: float) -> dict[str, Any]:
    node_args, coordinator_args = MODES[mode]
    with tempfile.TemporaryDirectory(prefix="spanflow-lb-") as tmp:
        topology = Path(tmp) / "topology.yaml"
        topology.write_text(TOPOLOGY)
        cluster = LocalCluster(
            topology,
            Path(tmp) / "data",
            port=0,
            node_args=node_args,
            coordinator_args=coordinator_args,
        )
        cluster.start()
        try:
            return measure(cluster, mode, seconds, rate, light_rate)
        finally:
            cluster.stop()


def pin(cluster: LocalCluster, node: str, cpu: int) -> None:
    """Keep a node's agent and everything it started (Spark's JVM and its threads) on one
    CPU, so nodes do not share cores: what a move gains on separate machines. Without
    it all three nodes share this machine's cores and a move adds no capacity."""
    root = psutil.Process(cluster.procs[f"node-{node}"].pid)
    for proc in [root, *root.children(recursive=True)]:
        subprocess.run(["taskset", "-a", "-cp", str(cpu), str(proc.pid)], capture_output=True)


def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def measure(
    cluster: LocalCluster, mode: str, seconds: float, rate: float, light_rate: float
) -> dict[str, Any]:
    api = Api(cluster.url, None, patience=30)

    def node(name: str) -> dict[str, Any]:
        return dict(api.call("GET", f"/api/v1/nodes/{name}"))

    def fragment(name: str) -> dict[str, Any]:
        return dict(api.call("GET", f"/api/v1/pipelines/{name}")["fragments"][0])

    until(lambda: node("g1")["ready"], 240, "g1 ready")
    if PINNED:
        pin(cluster, "g1", 0)
    for name, prefix, priority, tags in (
        ("busy", "busy", 5, ", node_tags: [big]"),
        ("light", "light", 0, ""),
    ):
        text = PIPELINE.format(name=name, stream=f"S_{name.upper()}", prefix=prefix, pin=tags)
        api.call("POST", "/api/v1/pipelines", {"yaml": text, "priority": priority})
    until(
        lambda: all(fragment(n)["status"] == "running" for n in ("busy", "light")), 180, "running"
    )
    cluster.start_node("g2")
    cluster.start_node("g3")
    until(lambda: node("g2")["ready"] and node("g3")["ready"], 240, "peers ready")
    if PINNED:
        pin(cluster, "g2", 1)
        pin(cluster, "g3", 1)
    time.sleep(10)  # let the peers' Spark start-up settle before the load starts
    busy = Publisher(cluster.nats_url, "S_BUSY", "busy", rate)
    light = Publisher(cluster.nats_url, "S_LIGHT", "light", light_rate)
    began = time.time()
    samples: list[dict[str, Any]] = []
    print(f"  [{mode}] peers ready; measuring {seconds:.0f} s", flush=True)
    while time.time() - began < seconds:
        g1 = node("g1")
        frags = g1.get("agent_fragments", {})
        samples.append(
            {
                "t": round(time.time() - began, 1),
                "g1_load": g1.get("load"),
                "busy_lag": frags.get("busy.f0", {}).get("lag"),
                "light_on": fragment("light")["node"],
            }
        )
        time.sleep(1.0)
    sent_light, sent_busy = light.stop(), busy.stop()
    log = api.call("GET", "/api/v1/cluster/log?limit=1000")
    moves = [e["detail"] for e in log if e["kind"] == "move-start"]

    def drained() -> bool:
        return stored(cluster.nats_url, "S_LIGHT_OUT") >= sent_light

    until(drained, 180, "light drained")
    busy_out = asyncio.run(_latencies(cluster.nats_url, "S_BUSY_OUT"))
    light_out = asyncio.run(_latencies(cluster.nats_url, "S_LIGHT_OUT"))
    ids = Counter(i for i, _, _ in light_out)
    window = [lat for _, at, lat in busy_out if at >= began]
    late_window = [lat for _, at, lat in busy_out if at >= began + seconds / 2]
    lags = [s["busy_lag"] for s in samples if s["busy_lag"] is not None]
    loads = [s["g1_load"] for s in samples if s["g1_load"] is not None]
    return {
        "mode": mode,
        "moves": len(moves),
        "move_reasons": [f"{m['fragment']} {m['node']}→{m['to']}: {m['reason']}" for m in moves],
        "busy_latency_s": percentiles(window),
        "busy_latency_second_half_s": percentiles(late_window),
        "light_latency_s": percentiles([lat for _, at, lat in light_out if at >= began]),
        "g1_busy_lag": {
            "max": max(lags, default=None),
            "last_10s_mean": round(statistics.fmean(lags[-10:]), 1) if lags else None,
        },
        "g1_load": {
            "max": max(loads, default=None),
            "last_10s_mean": round(statistics.fmean(loads[-10:]), 3) if loads else None,
        },
        "busy_sent": sent_busy,
        "busy_written": len(busy_out),
        "light_sent": sent_light,
        "light_lost": len(set(range(sent_light)) - set(ids)),
        "light_duplicated": sum(n - 1 for n in ids.values() if n > 1),
        "samples": samples,
    }


def show(r: dict[str, Any]) -> None:
    lat, late = r["busy_latency_s"] or {}, r["busy_latency_second_half_s"] or {}
    print(
        f"{r['mode']:<12} moves {r['moves']}  busy latency p50 {lat.get('p50')} s"
        f" p99 {lat.get('p99')} s (second half p99 {late.get('p99')} s)"
        f"  g1 lag max {r['g1_busy_lag']['max']} last-10s {r['g1_busy_lag']['last_10s_mean']}"
        f"  g1 load last-10s {r['g1_load']['last_10s_mean']}"
        f"  light lost {r['light_lost']} duplicated {r['light_duplicated']}",
        flush=True,
    )
    for reason in r["move_reasons"]:
        print(f"    {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=800.0, help="busy readings per second")
    parser.add_argument("--light-rate", type=float, default=800.0, help="light readings per second")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    results = []
    for mode in args.modes.split(","):
        print(f"mode {mode} …", flush=True)
        result = run_mode(mode, args.seconds, args.rate, args.light_rate)
        show(result)
        results.append(result)
    report = {
        "benchmark": "load_balance",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "seconds": args.seconds,
        "busy_rate": args.rate,
        "light_rate": args.light_rate,
        "pinned": "g1 on CPU 0, g2 and g3 on CPU 1" if PINNED else "no",
        "baseline": "mode none: no shedding, no rebalancer, same overload in the same run",
        "results": results,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "load_balance.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
