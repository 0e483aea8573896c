"""Chaos: lost, duplicated and availability under random faults, per fault type.

``spanflow up --ha`` on one machine — three NATS servers, three coordinators — and two
agents with their own Spark, each reaching NATS through relays the benchmark can cut
(one per NATS server, so a cut isolates the node as an unplugged cable would). A steady
stream (``--rate`` readings a second, 10 devices) runs through a pipeline that keeps
every reading (``events``) and counts them per device in 2 s windows.

The run is made twice in one invocation, on a fresh cluster each time: the pipeline
alone (one copy of its fragment), then with ``standby: 1`` (a hot standby replica on the
other node, docs/cluster.md#hot-standby). ``--only single|standby`` makes one of them.

Every ``--every`` seconds (default 25) one fault, the types in turn:

* ``agent``: SIGKILL the machine running the fragment — agent, Spark JVM and Python
  workers — (back 20 s later, ``--machine-back-after``: on this one box its reboot
  would take the survivor's cores during the recovery measured); with standby, the
  replicas' machines in turn;
* ``leader``: SIGKILL the leader coordinator (restarted 5 s later);
* ``standby``: SIGKILL a standby coordinator (restarted 5 s later);
* ``nats``: SIGKILL one NATS server (restarted 5 s later), in turn;
* ``cut``: cut the links of the node running the fragment (with standby: the replicas'
  in turn) for 15 s.

Figures:

* **lost / duplicated**: every reading's id in ``events`` once, every window's count
  exact (compared with what was published);
* **availability**: the share of the run's seconds in which outputs kept flowing
  within the pipeline's latency budget (``--budget``, 10 s): a second counts when
  every reading published in it is stored in ``events`` within the budget;
* per fault type: the **longest stall** (the worst latency of a reading published
  between this fault and the next, each boundary moved back by the undisturbed p99
  latency: a reading still on its way when a fault strikes is that fault's), the
  **time to recover** (from the fault to the first second after it that is available
  again, 0 when none was lost) and the **longest input wait** (from a reading's due
  time to its storing in the input stream: the devices' share of the stall);
* the baseline, measured in the same run: reading latency p50 / p99 before the first
  fault.

Goal (issue 31): lost 0, duplicated 0, availability ≥ 99.9 %.

Run: ``.venv/bin/python benchmarks/chaos.py [--seconds 300] [--every 25] [--rate 100]
[--trigger 1] [--machine-back-after 20] [--only single|standby] [--keep DIR]``.
Figures go to ``benchmarks/results/chaos.json`` (``runs.single`` and ``runs.standby``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import orjson
from nats.js.errors import NotFoundError

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from feed import publish_until_stored
from stats import pct

from spanflow.local.cluster import Api, LocalCluster
from spanflow.nats.ranges import read_range
from spanflow.nats.relay import WanRelay
from spanflow.nats.streams import connect, ensure_stream

RESULTS = Path(__file__).resolve().parent / "results"
FAULTS = ("agent", "leader", "standby", "nats", "cut")
RESTART_AFTER = 5.0
"""Seconds before a killed coordinator or NATS server is started again (a supervisor's
restart)."""
MACHINE_BACK_AFTER = 20.0
"""Seconds before a killed machine's agent starts again (``--machine-back-after``). On
this one box a machine's reboot (Python, a Spark JVM) takes the survivor's cores while
the survivor recovers its fragment — no real cluster does that — so by default it comes
back after the recovery being measured."""
CUT_FOR = 15.0

TOPOLOGY = """\
sites: [{name: cloud, kind: cloud}]
nodes:
  - {name: n1, site: cloud, capabilities: {cores: 1, slots: 2}}
  - {name: n2, site: cloud, capabilities: {cores: 1, slots: 2}}
"""

PIPELINE = """\
name: chaos
trigger: TRIGGERs
standby: STANDBY
sources:
  - id: src
    stream: CB_IN
    subjects: ["cbin.>"]
    schema: {device: string, ts: timestamp, id: long}
    event_time: ts
    max_out_of_orderness: 1s
    to: [by_device, keep]
processors:
  - {id: keep, type: filter, where: "id >= 0", to: [events]}
  - {id: by_device, type: key_by, key: device, to: [count]}
  - {id: count, type: window, tumbling: 2s, aggregates: {n: count}, to: [windows]}
sinks:
  - {id: events, type: jetstream, stream: CB_EVENTS, subject: "cbevents.x"}
  - {id: windows, type: jetstream, stream: CB_WINDOWS, subject: "cbwindows.x"}
"""


DEVICES = 10


class Feed:
    """``rate`` readings a second from :data:`DEVICES` devices, each device publishing its
    own readings in order, each until JetStream acknowledges it (a NATS server kill
    makes publishes fail for a while: they are retried with the same message id, so
    each reading is stored once). Remembers when each reading was due and which were
    acknowledged.

    Each device publishes on its own, as a fleet does: one publisher for all ten, each
    reading waiting for the last one's ack, took seconds after an election to work
    off the backlog it had built (900 readings one round trip at a time), which a
    pipeline could not win back."""

    def __init__(self, url: str, rate: float) -> None:
        self.url, self.rate = url, rate
        self.due: dict[int, float] = {}
        """reading id → when it was due (its timestamp), for the acknowledged ones."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Feed:
        self._thread.start()
        return self

    async def _run(self) -> None:
        nc = await connect(self.url)
        js = nc.jetstream()
        await ensure_stream(js, "CB_IN", ["cbin.>"])
        started = time.time()
        await asyncio.gather(*(self._device(js, d, started) for d in range(DEVICES)))
        await nc.close()

    async def _device(self, js: Any, device: int, started: float) -> None:
        """Readings ``device``, ``device + DEVICES``, … each when it is due."""
        i = device
        while not self._stop.is_set():
            due = int((time.time() - started) * self.rate)
            while i < due and not self._stop.is_set():
                at = started + i / self.rate
                ts = datetime.fromtimestamp(at, UTC).isoformat()
                record = {"device": f"d{device}", "ts": ts, "id": i}
                await publish_until_stored(js, f"cbin.d{device}", orjson.dumps(record), str(i))
                self.due[i] = at
                i += DEVICES
            await asyncio.sleep(0.02)

    def stop(self) -> dict[int, float]:
        """Stop publishing; the acknowledged readings with their due times."""
        self._stop.set()
        self._thread.join(60)
        return dict(self.due)


class Links:
    """A node's relays, one per NATS server: its NATS URL list, and a cable to pull."""

    def __init__(self, nats_url: str) -> None:
        self.relays = []
        for url in nats_url.split(","):
            target = urlparse(url)
            self.relays.append(WanRelay(target.hostname or "127.0.0.1", target.port or 0).start())

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{r.port}" for r in self.relays)

    def cut(self) -> None:
        for r in self.relays:
            r.cut()

    def restore(self) -> None:
        for r in self.relays:
            r.restore()

    def stop(self) -> None:
        for r in self.relays:
            r.stop()


def fragment_node(api: Api, turn: int = 0) -> str | None:
    """The node of the fragment (with standby: of replica ``turn`` mod 2, else of the
    other one when that one is not placed)."""
    try:
        frags = api.call("GET", "/api/v1/pipelines/chaos")["fragments"]
    except Exception:
        return None
    placed = [f["node"] for f in frags if f["node"]]
    if not placed:
        return None
    wanted = frags[turn % len(frags)]["node"]
    return str(wanted or placed[0])


def node_ready(api: Api, name: str) -> bool:
    node = api.call("GET", f"/api/v1/nodes/{name}")
    return bool(node["state"] == "alive" and node.get("ready"))


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f} s")
        time.sleep(0.5)


def stored(url: str, stream: str) -> list[tuple[bytes, float]]:
    """(payload, stored at, seconds since the epoch) of every message."""

    async def go() -> list[tuple[bytes, float]]:
        nc = await connect(url)
        try:
            try:
                info = await nc.jetstream().stream_info(stream)
            except NotFoundError:
                return []  # not made yet
            msgs = await read_range(nc, stream, 1, int(info.state.last_seq) + 1)
            return [(m.data, m.published_us / 1e6) for m in msgs]
        finally:
            await nc.close()

    return asyncio.run(go())


class Chaos:
    def __init__(
        self,
        cluster: LocalCluster,
        links: dict[str, Links],
        machine_back_after: float = MACHINE_BACK_AFTER,
    ) -> None:
        self.cluster = cluster
        self.machine_back_after = machine_back_after
        self.links = links
        self.api = Api(cluster.url, None, patience=60)
        self.nats_turn = 0
        self.node_turn = 0
        self.log: list[dict[str, Any]] = []
        self._pending: list[tuple[float, Any]] = []

    def inject(self, kind: str) -> None:
        """One fault now; what repairs it is scheduled."""
        at = time.time()
        c = self.cluster
        target = ""
        if kind == "agent":
            target = self._fragments_node()
            c.kill(f"node-{target}", tree=True)
            self._later(
                self.machine_back_after,
                lambda t=target: c.start_node(t, nats=self.links[t].url),
            )
        elif kind in ("leader", "standby"):
            leader = c.leader()
            alive = [n for n in c.coordinators if c.procs[n].poll() is None]
            pick = [n for n in alive if (n == leader) == (kind == "leader")]
            target = pick[0] if pick else alive[0]
            c.kill(target)
            self._later(RESTART_AFTER, lambda t=target: c.start_coordinator(t))
        elif kind == "nats":
            index = self.nats_turn % 3
            self.nats_turn += 1
            target = f"nats-{index + 1}"
            c._nats.servers[index].kill()
            self._later(RESTART_AFTER, lambda i=index: c._nats.restart(i))
        elif kind == "cut":
            target = self._fragments_node()
            self.links[target].cut()
            self._later(CUT_FOR, self.links[target].restore)
        self.log.append({"kind": kind, "target": target, "at": at})
        print(f"{time.strftime('%H:%M:%S')} fault: {kind} {target}", flush=True)

    def _fragments_node(self) -> str:
        self.node_turn += 1
        return fragment_node(self.api, self.node_turn) or "n1"

    def _later(self, delay: float, action: Any) -> None:
        self._pending.append((time.monotonic() + delay, action))

    def tick(self) -> None:
        now = time.monotonic()
        due = [p for p in self._pending if p[0] <= now]
        self._pending = [p for p in self._pending if p[0] > now]
        for _, action in due:
            try:
                action()
            except Exception as exc:
                print(f"repair failed: {exc}", flush=True)

    def settle(self) -> None:
        while self._pending:
            self.tick()
            time.sleep(0.2)


def availability(
    due: dict[int, float], stored_at: dict[int, float], budget: float, start: float, end: float
) -> tuple[float, dict[int, float]]:
    """The share of seconds in [start, end) whose readings were all stored within
    ``budget``; and each second's worst latency (inf when one is missing)."""
    worst: dict[int, float] = defaultdict(float)
    for i, at in due.items():
        if not start <= at < end:
            continue
        latency = stored_at.get(i, float("inf")) - at
        second = int(at - start)
        worst[second] = max(worst[second], latency)
    seconds = list(range(int(end - start)))
    good = sum(1 for s in seconds if worst.get(s, 0.0) <= budget)
    return good / max(1, len(seconds)), dict(worst)


def per_fault(
    log: list[dict[str, Any]],
    worst: dict[int, float],
    start: float,
    end: float,
    budget: float,
    worst_in: dict[int, float] | None = None,
    in_flight: float = 0.0,
) -> dict[str, dict[str, float]]:
    """Per fault type: the longest stall, the time to recover, and (``worst_in``: each
    second's worst wait from a reading's due time to its storing in the input stream)
    how much of the stall the devices' publishing alone took.

    A fault's share is the readings due from ``in_flight`` seconds (the undisturbed p99
    latency) before it until as long before the next fault: a reading published just
    before a fault is still on its way when the fault strikes, and its delay is that
    fault's doing, not the previous one's."""
    out: dict[str, dict[str, float]] = {}
    for n, fault in enumerate(log):
        first = max(0, round(fault["at"] - start - in_flight))
        nxt = log[n + 1]["at"] if n + 1 < len(log) else end + in_flight
        last = round(nxt - start - in_flight)
        span = [worst.get(s, 0.0) for s in range(first, last)]
        stall = max(span, default=0.0)
        bad = [s for s in range(first, last) if worst.get(s, 0.0) > budget]
        recover = (bad[-1] + 1 - first) if bad else 0.0
        entry = out.setdefault(
            fault["kind"], {"faults": 0, "longest_stall_s": 0.0, "recover_s": 0.0}
        )
        entry["faults"] += 1
        entry["longest_stall_s"] = round(max(entry["longest_stall_s"], stall), 2)
        entry["recover_s"] = round(max(entry["recover_s"], float(recover)), 2)
        if worst_in is not None:
            waited = max((worst_in.get(s, 0.0) for s in range(first, last)), default=0.0)
            entry["longest_input_wait_s"] = round(
                max(entry.get("longest_input_wait_s", 0.0), waited), 2
            )
    return out


def run(
    seconds: float,
    every: float,
    rate: float,
    budget: float,
    root: Path,
    *,
    standby: bool,
    trigger: float,
    machine_back_after: float = MACHINE_BACK_AFTER,
) -> dict[str, Any]:
    topology = root / "topology.yaml"
    topology.write_text(TOPOLOGY)
    cluster = LocalCluster(topology, root / "cluster", port=0, ha=True)
    feed: Feed | None = None
    links: dict[str, Links] = {}
    try:
        cluster.start()
        for name in ("n1", "n2"):
            links[name] = Links(cluster.nats_url)
            cluster.start_node(name, nats=links[name].url)
        api = Api(cluster.url, None, patience=60)
        wait(lambda: node_ready(api, "n1") and node_ready(api, "n2"), 300, "nodes ready")
        feed = Feed(cluster.nats_url, rate).start()
        pipeline = PIPELINE.replace("TRIGGER", f"{trigger:g}").replace("STANDBY", str(int(standby)))
        api.call("POST", "/api/v1/pipelines", {"yaml": pipeline, "filename": "chaos.yaml"})
        wait(lambda: fragment_node(api) is not None, 180, "placed")
        wait(lambda: len(stored(cluster.nats_url, "CB_EVENTS")) > rate * 5, 300, "flowing")
        chaos = Chaos(cluster, links, machine_back_after)
        start = time.time()
        warmup = min(20.0, every)
        next_fault = time.monotonic() + warmup
        turn = 0
        while time.time() - start < seconds:
            chaos.tick()
            if time.monotonic() >= next_fault:
                chaos.inject(FAULTS[turn % len(FAULTS)])
                turn += 1
                next_fault += every
            time.sleep(0.2)
        end = time.time()
        chaos.settle()
        due = feed.stop()
        feed = None
        wait(
            lambda: set(due) <= set(first_times(stored(cluster.nats_url, "CB_EVENTS"))),
            300,
            "all stored",
        )
        events = stored(cluster.nats_url, "CB_EVENTS")
        ids = Counter(json.loads(data)["id"] for data, _ in events)
        first_stored = first_times(events)
        lost = sum(1 for i in due if i not in ids)
        duplicated = sum(n - 1 for n in ids.values() if n > 1)
        share, worst = availability(due, first_stored, budget, start, end)
        _, worst_in = availability(
            due, first_times(stored(cluster.nats_url, "CB_IN")), budget, start, end
        )
        first_fault = chaos.log[0]["at"] if chaos.log else end
        baseline = [  # readings stored before the first fault: the undisturbed latency
            first_stored[i] - at
            for i, at in due.items()
            if start <= at and i in first_stored and first_stored[i] < first_fault
        ]
        windows_wrong = check_windows(cluster.nats_url, due)
        nodes = api.call("GET", "/api/v1/nodes")
        return {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
            "seconds": round(end - start, 1),
            "every_s": every,
            "rate_per_s": rate,
            "standby": standby,
            "trigger_s": trigger,
            "budget_s": budget,
            "sent": len(due),
            "devices": DEVICES,
            "lost": lost,
            "duplicated": duplicated,
            "windows_wrong": windows_wrong,
            "availability": round(share, 5),
            "per_fault": per_fault(
                chaos.log, worst, start, end, budget, worst_in, in_flight=pct(baseline, 99)
            ),
            "machine_back_after_s": chaos.machine_back_after,
            "faults": [{**f, "at": round(f["at"] - start, 1)} for f in chaos.log],
            "baseline_latency_s": {
                "p50": round(pct(baseline, 50), 3),
                "p99": round(pct(baseline, 99), 3),
            },
            "nodes_at_end": {n["name"]: n["state"] for n in nodes},
            "goal": {"lost": 0, "duplicated": 0, "availability_at_least": 0.999},
        }
    finally:
        if feed is not None:
            feed.stop()
        for link in links.values():
            link.stop()
        cluster.stop()


def first_times(messages: list[tuple[bytes, float]]) -> dict[int, float]:
    """reading id → when its first copy was stored."""
    first: dict[int, float] = {}
    for data, at in messages:
        i = json.loads(data)["id"]
        first[i] = min(first.get(i, at), at)
    return first


def check_windows(url: str, due: dict[int, float]) -> int:
    """Windows whose count differs from what was published in them (each stored once)."""
    expected: Counter[tuple[str, str]] = Counter()
    for i, when in due.items():
        at = datetime.fromtimestamp(when, UTC)
        start = at - timedelta(seconds=at.second % 2, microseconds=at.microsecond)
        expected[(f"d{i % DEVICES}", start.isoformat())] += 1
    got: dict[tuple[str, str], list[int]] = defaultdict(list)
    for data, _ in stored(url, "CB_WINDOWS"):
        w = json.loads(data)
        start = datetime.fromisoformat(w["window_start"].replace("Z", "+00:00"))
        got[(w["device"], start.isoformat())].append(w["n"])
    closed = {k for k in expected if k in got}  # the last windows may still be open
    wrong = sum(1 for k in closed if got[k] != [expected[k]])
    return wrong + sum(1 for k in got if k not in expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--every", type=float, default=25.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--budget", type=float, default=10.0)
    parser.add_argument("--trigger", type=float, default=1.0)
    parser.add_argument("--only", choices=("single", "standby"))
    parser.add_argument(
        "--machine-back-after",
        type=float,
        default=MACHINE_BACK_AFTER,
        help="seconds before a killed machine's agent starts again",
    )
    parser.add_argument(
        "--keep", metavar="DIR", help="run each cluster under DIR/<variant> and keep its logs"
    )
    args = parser.parse_args()
    runs: dict[str, Any] = {}
    for variant in ("single", "standby"):
        if args.only not in (None, variant):
            continue
        keep = Path(args.keep) / variant if args.keep else None
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        with (
            contextlib.nullcontext(str(keep))
            if keep
            else tempfile.TemporaryDirectory(prefix="spanflow-chaos-") as tmp
        ):
            runs[variant] = run(
                args.seconds,
                args.every,
                args.rate,
                args.budget,
                Path(tmp),
                standby=variant == "standby",
                trigger=args.trigger,
                machine_back_after=args.machine_back_after,
            )
        shown = {k: v for k, v in runs[variant].items() if k != "faults"}
        print(variant, json.dumps(shown, indent=2), flush=True)
    RESULTS.mkdir(exist_ok=True)
    result = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "runs": runs}
    (RESULTS / "chaos.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.keep:  # beside the kept logs, which it explains
        (Path(args.keep) / "chaos.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
