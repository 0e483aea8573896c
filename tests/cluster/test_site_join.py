"""A third plant joins a running two-plant pipeline and leaves it again, on a real
cluster: hub NATS, the coordinator and an agent per plant and for the cloud, each with
its own Spark.

The new plant's agent starts, its stream is declared over REST, and the coordinator
takes the site into the running pipeline on its own (a savepoint, then the same spec
planned again): the new plant's fragment starts empty, the global fragment goes on from
its savepoint reading one site more. Checked against an oracle of every reading
published: the cloud's windows — one of them open across the join — hold every plant's
readings once, and the other plants' edge output is complete and never written twice.
When the plant's stream is declared away, the pipeline drains it — the cloud reads all
it sent — before dropping its source.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from spanflow.api.topology_loader import load_topology_text
from spanflow.local.cluster import LocalCluster
from tests.cluster.conftest import StartCluster
from tests.helpers import publish, read_records, wait_for

pytestmark = pytest.mark.slow

PLANTS = """\
sites: [{name: plant-a, kind: edge}, {name: plant-b, kind: edge}, {name: cloud, kind: cloud}]
nodes:
  - name: ea
    site: plant-a
    local: true
    capabilities: {cores: 1, slots: 2}
    streams: [{name: JOIN_IN, subjects: ["joinin.a.>"]}]
  - name: eb
    site: plant-b
    local: true
    capabilities: {cores: 1, slots: 2}
    streams: [{name: JOIN_IN, subjects: ["joinin.b.>"]}]
  - name: cloud-1
    site: cloud
    local: true
    capabilities: {cores: 2, slots: 4}
links:
  - {between: [plant-a, cloud], latency: 20ms}
  - {between: [plant-b, cloud], latency: 20ms}
"""

NEW_NODE = "  - {name: ec, site: plant-c, local: true, capabilities: {cores: 1, slots: 2}}\n"
"""The third plant's node as its agent starts: no stream declared yet."""

PIPELINE = """\
name: fleet
trigger: 0.5s
sources:
  - id: readings
    stream: JOIN_IN
    schema: {plant: string, seq: long, ts: timestamp}
    key: plant
    event_time: ts
    max_out_of_orderness: 2s
    to: [valid]
processors:
  - {id: valid, type: filter, where: "seq >= 0", to: [seen, per_10s]}
  - id: per_10s
    type: window
    tumbling: 10s
    aggregates: {n: count, seqs: sum(seq)}
    at: cloud
    to: [windows]
sinks:
  - {id: seen, type: jetstream, stream: JOIN_SEEN, subject: "seen.{plant}"}
  - {id: windows, type: jetstream, stream: JOIN_W, subject: "w.{plant}"}
"""

BASE = 1_800_000_000
PER_SECOND = 10


def readings(plant: str, start: float, stop: float) -> list[dict[str, Any]]:
    """``plant``'s readings from second ``start`` to ``stop`` of event time."""
    first, last = round(start * PER_SECOND), round(stop * PER_SECOND)
    return [{"plant": plant, "seq": i, "ts": BASE + i / PER_SECOND} for i in range(first, last)]


def send(url: str, records: list[dict[str, Any]]) -> None:
    for plant in sorted({r["plant"] for r in records}):
        mine = [r for r in records if r["plant"] == plant]
        publish(url, "JOIN_IN", f"joinin.{plant}.r", mine)


def windows_oracle(records: list[dict[str, Any]], closed_before: int) -> Counter[tuple]:
    """(plant, window start, count, sum of seq) of each 10-s window starting before
    second ``closed_before`` (the later ones are still open)."""
    per: dict[tuple[str, int], list[int]] = {}
    for r in records:
        start = int((r["ts"] - BASE) // 10 * 10)
        if start < closed_before:
            per.setdefault((r["plant"], start), []).append(r["seq"])
    return Counter({(p, w, len(s), sum(s)): 1 for (p, w), s in per.items()})


def windows_written(url: str) -> Counter[tuple]:
    return Counter(
        (
            r["plant"],
            int(datetime.fromisoformat(r["window_start"]).timestamp()) - BASE,
            r["n"],
            r["seqs"],
        )
        for r in read_records(url, "JOIN_W")
    )


def seen(url: str) -> Counter[tuple[str, int]]:
    return Counter((r["plant"], r["seq"]) for r in read_records(url, "JOIN_SEEN"))


@pytest.fixture
def cluster(start_cluster: StartCluster) -> LocalCluster:
    return start_cluster(PLANTS, home="home", wait_nodes=240, heartbeat=0.5)


def test_a_plant_joins_a_running_pipeline_and_leaves_it_drained_every_window_once(
    cluster: LocalCluster,
) -> None:
    api, url = cluster.api(), cluster.nats_url
    before = readings("a", 0, 15) + readings("b", 0, 15)
    send(url, before)
    api.call("POST", "/api/v1/pipelines", {"yaml": PIPELINE})
    wait_for(lambda: api.call("GET", "/api/v1/pipelines/fleet")["state"] == "running", 240)
    # The first windows are written; the window [10 s, 20 s) of each plant is open.
    wait_for(lambda: len(windows_written(url)) >= 2, timeout=240)
    assert windows_written(url) == windows_oracle(before, closed_before=10)

    # The third plant: its site and link, its agent, then the stream it hosts.
    api.call("PUT", "/api/v1/topology/sites", {"name": "plant-c", "kind": "edge"})
    api.call("PUT", "/api/v1/topology/links", {"between": ["plant-c", "cloud"], "latency": "20ms"})
    with_c = PLANTS.replace(
        "{name: cloud, kind: cloud}]", "{name: plant-c}, {name: cloud, kind: cloud}]"
    )
    cluster.topology = load_topology_text(with_c.replace("links:\n", NEW_NODE + "links:\n"))
    cluster.start_node("ec")

    def registered() -> bool:
        return any(
            n["name"] == "ec" and n["state"] == "alive" for n in api.call("GET", "/api/v1/nodes")
        )

    wait_for(registered, timeout=240)
    stream = {"name": "JOIN_IN", "subjects": ["joinin.c.>"]}
    node = {"name": "ec", "site": "plant-c", "streams": [stream]}
    api.call("PUT", "/api/v1/topology/nodes", {**node, "capabilities": {"cores": 1, "slots": 2}})

    def joined() -> bool:
        status = api.call("GET", "/api/v1/pipelines/fleet")
        fragments = {f["id"]: f for f in status["fragments"]}
        return (
            status["state"] == "running"
            and "fleet.at-plant-c" in fragments
            and fragments["fleet.at-plant-c"]["node"] == "ec"
            and "plant-c" in fragments["fleet.global"]["input_sites"]
            and status["sites_behind"] is None
        )

    wait_for(joined, timeout=300)
    log = api.call("GET", "/api/v1/cluster/log?limit=1000")
    (asked,) = [e for e in log if e["kind"] == "pipeline-upgrade"]
    assert asked["detail"]["because"] == "site plant-c joined"
    assert [e["kind"] for e in log].count("pipeline-upgraded") == 1

    # After the join every plant goes on into the open window and the next one.
    after = [*readings("a", 15, 30), *readings("b", 15, 30), *readings("c", 16, 30)]
    send(url, after)
    expected = windows_oracle(before + after, closed_before=20)
    wait_for(lambda: sum(windows_written(url).values()) >= sum(expected.values()), timeout=300)
    assert windows_written(url) == expected  # the open window whole, plant c's once

    # The third plant leaves while its last readings may still be on their way: its
    # stream is declared away; the pipeline lets it go once the cloud has read them.
    # Plants a and b go on sending meanwhile (the global fragment's batches, which only
    # input brings, are what tells that it has read everything plant c sent).
    with Feeder(url, "ab", from_second=30) as feeder:
        api.call("PUT", "/api/v1/topology/nodes", {**node, "streams": []})

        def let_go() -> bool:
            status = api.call("GET", "/api/v1/pipelines/fleet")
            fragments = {f["id"]: f for f in status["fragments"]}
            return (
                status["state"] == "running"
                and "fleet.at-plant-c" not in fragments
                and "plant-c" not in fragments["fleet.global"]["input_sites"]
            )

        wait_for(let_go, timeout=300)
    log = api.call("GET", "/api/v1/cluster/log?limit=1000")
    asked = [e["detail"]["because"] for e in log if e["kind"] == "pipeline-upgrade"]
    assert asked == ["site plant-c joined", "site plant-c left (drained)"]
    assert "site-draining" in {e["kind"] for e in log}

    # A last reading of plants a and b 20 s after the newest closes every window with
    # readings, plant c's last one too: all it sent was read before its source went.
    closing = (int(max(r["ts"] for r in feeder.sent) - BASE) // 10 + 2) * 10
    last = [r for p in "ab" for r in readings(p, closing, closing + 0.1)]
    send(url, last)
    everything = before + after + feeder.sent + last
    expected = windows_oracle(everything, closed_before=closing)
    wait_for(lambda: sum(windows_written(url).values()) >= sum(expected.values()), timeout=300)
    assert windows_written(url) == expected  # every plant's windows once
    wanted = Counter((r["plant"], r["seq"]) for r in everything)
    wait_for(lambda: sum(seen(url).values()) >= len(everything), timeout=240)
    assert seen(url) == wanted  # every plant's edge output complete, nothing twice


class Feeder:
    """Plants that go on sending, a second of event time per second, in the background."""

    def __init__(self, url: str, plants: str, from_second: float) -> None:
        self.url, self.plants, self.at = url, plants, from_second
        self.sent: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            chunk = [r for p in self.plants for r in readings(p, self.at, self.at + 0.5)]
            send(self.url, chunk)
            self.sent += chunk
            self.at += 0.5
