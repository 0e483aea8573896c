"""Three agents gossip in one site; a SIGKILLed one is declared dead by its peers.

The coordinator is told to wait 60 heartbeat periods before failing a silent node, so
a failure within seconds can only come from the partition's gossip verdict (the
control log's record says so). The fragment then runs on a peer from its checkpoint,
and every reading is written exactly once.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanflow.cli.cluster import Api, LocalCluster
from tests.helpers import Feed, read_all, stored, wait_for

pytestmark = pytest.mark.slow

TOPOLOGY = """\
sites: [{name: plant, kind: cloud}]
nodes:
  - {name: g1, site: plant, local: true, capabilities: {cores: 1, slots: 2}}
  - {name: g2, site: plant, local: true, capabilities: {cores: 1, slots: 2}}
  - {name: g3, site: plant, local: true, capabilities: {cores: 1, slots: 2}}
"""

PIPELINE = """\
name: gossiped
trigger: 0.5s
sources:
  - {id: src, stream: G_IN, subjects: ["gin.>"], schema: {device: string, id: long}, to: [keep]}
processors:
  - {id: keep, type: filter, where: "id >= 0", to: [out]}
sinks:
  - {id: out, type: jetstream, stream: G_OUT, subject: "gout.x"}
"""
NODES = ("g1", "g2", "g3")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    c = LocalCluster(topology, tmp_path / "data", port=0, failure_after=60)
    try:
        yield c.start()
    finally:
        c.stop()


def node(api: Api, name: str) -> dict[str, Any]:
    return dict(api.call("GET", f"/api/v1/nodes/{name}"))


def sees_peers_alive(api: Api, name: str) -> bool:
    status = node(api, name)
    peers = status["gossip"]
    others = set(NODES) - {name}
    return bool(status["ready"]) and all(peers.get(p, {}).get("state") == "alive" for p in others)


def fragment(api: Api) -> dict[str, Any]:
    return dict(api.call("GET", "/api/v1/pipelines/gossiped")["fragments"][0])


def test_a_killed_agent_is_declared_dead_by_gossip_and_its_fragment_moves(
    cluster: LocalCluster,
) -> None:
    api = Api(cluster.url, None, patience=30)
    wait_for(lambda: all(sees_peers_alive(api, n) for n in NODES), timeout=300)
    feed = Feed(cluster.nats_url, "G_IN", "gin")
    api.call("POST", "/api/v1/pipelines", {"yaml": PIPELINE})
    wait_for(lambda: fragment(api)["status"] == "running", timeout=120)
    wait_for(lambda: stored(cluster.nats_url, "G_OUT") > 50, timeout=120)

    victim = fragment(api)["node"]
    killed_at = time.monotonic()
    cluster.kill(f"node-{victim}")
    wait_for(lambda: node(api, victim)["state"] == "failed", timeout=30, interval=0.1)
    detected = time.monotonic() - killed_at
    assert detected < 10, f"failed after {detected:.1f} s: not by gossip (heartbeats wait 60 s)"
    log = api.call("GET", "/api/v1/cluster/log?limit=1000")
    failed = [e["detail"] for e in log if e["kind"] == "node-failed"]
    assert failed and failed[-1]["node"] == victim, failed
    assert "declared dead by its partition's gossip" in failed[-1]["reason"], failed

    def moved() -> bool:
        f = fragment(api)
        return f["node"] not in (None, victim) and f["status"] == "running"

    wait_for(moved, timeout=90)
    survivor = fragment(api)["node"]
    wait_for(lambda: node(api, survivor)["gossip"][victim]["state"] == "dead", timeout=10)

    sent = feed.stop()
    wait_for(lambda: stored(cluster.nats_url, "G_OUT") >= sent, timeout=120)
    ids = Counter(json.loads(data)["id"] for _, data, _ in read_all(cluster.nats_url, "G_OUT"))
    ids.pop(-1, None)
    assert ids == Counter(range(sent)), (
        f"lost {len(set(range(sent)) - set(ids))}, "
        f"duplicated {sum(n - 1 for n in ids.values() if n > 1)}"
    )
