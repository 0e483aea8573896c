"""Three agents in one site: an overloaded one sheds its lowest-priority fragment to
the least-loaded peer, then the peer is SIGKILLed and declared dead by gossip.

g1 starts alone (one core offered) and gets two pipelines: ``busy``
(priority 5, pinned to g1's tag, fed fast) and ``light`` (priority 0). Then g2 and g3
join. g1's load stays over its threshold, so it asks — from its gossip view of its
peers' loads — for ``light`` to move to the least-loaded peer; the coordinator moves
it through a savepoint, and g1's load falls. Then the node running ``light`` is
SIGKILLed. The coordinator waits 60 heartbeat periods before failing a silent node,
so a failure within seconds can only come from the partition's gossip verdict (the
control log's record says so); ``light`` runs elsewhere from its checkpoint. Its
output is exactly once across both moves.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from spanflow.local.cluster import Api, LocalCluster
from tests.cluster.conftest import StartCluster
from tests.helpers import Feed, read_all, stored, wait_for

pytestmark = pytest.mark.slow

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
  - {{id: src, stream: {stream}, subjects: ["{prefix}.>"], schema: {{device: string, id: long}},
     to: [keep]}}
processors:
  - {{id: keep, type: filter, where: "id >= 0", to: [out]{pin}}}
sinks:
  - {{id: out, type: jetstream, stream: {stream}_OUT, subject: "{prefix}out.x"}}
"""
SHEDDING = ["--shed-high", "0.7", "--shed-low", "0.6", "--shed-sustain", "5"]


@pytest.fixture
def cluster(start_cluster: StartCluster) -> LocalCluster:
    return start_cluster(
        TOPOLOGY,
        node_args=SHEDDING,
        failure_after=60,
        coordinator_args=["--no-rebalance"],  # peers shed here: the rebalancer must not
    )


def submit(api: Api, name: str, stream: str, prefix: str, priority: int, pin: str = "") -> None:
    text = PIPELINE.format(name=name, stream=stream, prefix=prefix, pin=pin)
    api.call("POST", "/api/v1/pipelines", {"yaml": text, "priority": priority})


def fragment(api: Api, pipeline: str) -> dict[str, Any]:
    return dict(api.call("GET", f"/api/v1/pipelines/{pipeline}")["fragments"][0])


def node(api: Api, name: str) -> dict[str, Any]:
    return dict(api.call("GET", f"/api/v1/nodes/{name}"))


def test_an_overloaded_node_sheds_and_a_killed_peer_is_declared_dead_by_gossip(
    cluster: LocalCluster,
) -> None:
    api = Api(cluster.url, None, patience=30)
    wait_for(lambda: node(api, "g1")["ready"], timeout=240)
    submit(api, "busy", "S_BUSY", "busy", priority=5, pin=", node_tags: [big]")
    submit(api, "light", "S_LIGHT", "light", priority=0)
    for name in ("busy", "light"):
        wait_for(lambda n=name: fragment(api, n)["status"] == "running", timeout=120)  # type: ignore[misc]
        assert fragment(api, name)["node"] == "g1", "g1 is the only node so far"
    busy = Feed(cluster.nats_url, "S_BUSY", "busy", rate=1000)
    light = Feed(cluster.nats_url, "S_LIGHT", "light", rate=50)
    wait_for(lambda: stored(cluster.nats_url, "S_LIGHT_OUT") > 50, timeout=120)
    cluster.start_node("g2")
    cluster.start_node("g3")

    def peers_known() -> bool:
        gossip = node(api, "g1")["gossip"]
        return all(
            gossip.get(p, {}).get("state") == "alive" and gossip[p].get("load") is not None
            for p in ("g2", "g3")
        )

    wait_for(peers_known, timeout=240)
    loads_before = [node(api, "g1")["load"]]

    def shed() -> bool:
        loads_before.append(node(api, "g1")["load"])
        f = fragment(api, "light")
        return f["node"] in ("g2", "g3") and f["status"] == "running"

    wait_for(shed, timeout=180, interval=1.0)
    log = api.call("GET", "/api/v1/cluster/log?limit=1000")
    moves = [e["detail"] for e in log if e["kind"] == "move-start"]
    assert len(moves) == 1 and moves[0]["fragment"] == "light.f0", moves
    assert moves[0]["reason"].startswith("shed by g1 (load "), moves
    assert fragment(api, "busy")["node"] == "g1", "the higher priority stays"
    target = moves[0]["to"]
    peer_loads = [node(api, p)["load"] for p in ("g2", "g3")]
    assert node(api, target)["load"] is not None and max(peer_loads) is not None

    def relieved() -> bool:
        load = node(api, "g1")["load"]
        return load is not None and load < max(loads_before[-5:])

    wait_for(relieved, timeout=120, interval=1.0)

    # The peer now running `light` dies: its partition declares it dead within seconds.
    killed_at = time.monotonic()
    cluster.kill(f"node-{target}")
    wait_for(lambda: node(api, target)["state"] == "failed", timeout=30, interval=0.1)
    detected = time.monotonic() - killed_at
    assert detected < 10, f"failed after {detected:.1f} s: not by gossip (heartbeats wait 60 s)"
    log = api.call("GET", "/api/v1/cluster/log?limit=1000")
    failed = [e["detail"] for e in log if e["kind"] == "node-failed"]
    assert failed[-1]["node"] == target, failed
    assert "declared dead by its partition's gossip" in failed[-1]["reason"], failed

    def moved_again() -> bool:
        f = fragment(api, "light")
        return f["node"] not in (None, target) and f["status"] == "running"

    wait_for(moved_again, timeout=90)
    # g1's view says dead — or has forgotten the member already, which it does once
    # it has been dead for gossip_to_the_dead (moving the fragment may take longer).
    wait_for(
        lambda: node(api, "g1")["gossip"].get(target, {"state": "dead"})["state"] == "dead",
        timeout=10,
    )

    sent = light.stop()
    busy.stop()
    wait_for(lambda: stored(cluster.nats_url, "S_LIGHT_OUT") >= sent, timeout=120)
    ids = Counter(
        json.loads(data)["id"] for _, data, _ in read_all(cluster.nats_url, "S_LIGHT_OUT")
    )
    ids.pop(-1, None)
    assert ids == Counter(range(sent)), (
        f"lost {len(set(range(sent)) - set(ids))}, "
        f"duplicated {sum(n - 1 for n in ids.values() if n > 1)}"
    )
