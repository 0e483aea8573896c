"""Chaos on the highly available cluster (``spanflow up --ha``: three NATS servers,
three coordinators, two agents with their own Spark), during a steady stream:
SIGKILL the agent running the fragment, the leader coordinator, one NATS server and
the other agent, each restarted as a supervisor would. Every reading must come out
exactly once (lost 0, duplicated 0) and every window count must be exact."""

from __future__ import annotations

import time
from typing import Any

import pytest

from spanflow.local.cluster import Api, LocalCluster
from tests.cluster.conftest import StartCluster
from tests.helpers import Feed, assert_feed_exactly_once, stored, stream_leader, wait_for

pytestmark = pytest.mark.slow

TOPOLOGY = """\
sites: [{name: cloud, kind: cloud}]
nodes:
  - {name: n1, site: cloud, local: true, capabilities: {cores: 1, slots: 2}}
  - {name: n2, site: cloud, local: true, capabilities: {cores: 1, slots: 2}}
"""

PIPELINE = """\
name: chaos
trigger: 0.5s
sources:
  - id: src
    stream: CH_IN
    subjects: ["chin.>"]
    schema: {device: string, ts: timestamp, id: long}
    event_time: ts
    max_out_of_orderness: 1s
    to: [by_device, keep]
processors:
  - {id: keep, type: filter, where: "id >= 0", to: [events]}
  - {id: by_device, type: key_by, key: device, to: [count]}
  - {id: count, type: window, tumbling: 2s, aggregates: {n: count}, to: [windows]}
sinks:
  - {id: events, type: jetstream, stream: CH_EVENTS, subject: "chevents.x"}
  - {id: windows, type: jetstream, stream: CH_WINDOWS, subject: "chwindows.x"}
"""


@pytest.fixture
def cluster(start_cluster: StartCluster) -> LocalCluster:
    return start_cluster(TOPOLOGY, ha=True)


def fragment(api: Api) -> dict[str, Any]:
    return dict(api.call("GET", "/api/v1/pipelines/chaos")["fragments"][0])


def ready(api: Api, name: str) -> bool:
    node = api.call("GET", f"/api/v1/nodes/{name}")
    return bool(node["state"] == "alive" and node["ready"])


def decisions(api: Api) -> list[tuple[str, Any]]:
    """The control log's failures and placements, in order."""
    kinds = ("node-failed", "assign", "unassign", "move-start")
    log = api.call("GET", "/api/v1/cluster/log?limit=1000")
    return [(r["kind"], r.get("seq")) for r in log if r["kind"] in kinds]


def kill_the_fragments_node(cluster: LocalCluster, api: Api) -> None:
    """SIGKILL the agent running the fragment; once it runs elsewhere, restart it."""
    before = fragment(api)["node"]
    cluster.kill(f"node-{before}")

    def moved() -> bool:
        f = fragment(api)
        return f["node"] not in (None, before) and f["status"] == "running"

    killed_at = time.monotonic()
    try:
        wait_for(moved, timeout=120)
    except AssertionError:
        nodes = {n["name"]: (n["state"], n.get("ready")) for n in api.call("GET", "/api/v1/nodes")}
        log = [r["kind"] for r in api.call("GET", "/api/v1/cluster/log?limit=30")]
        raise AssertionError(
            f"not moved: fragment {fragment(api)}, nodes {nodes}, log {log}"
        ) from None
    print(f"{before} killed: its fragment ran elsewhere {time.monotonic() - killed_at:.1f} s later")
    cluster.start_node(before)


def test_kills_of_agents_leader_and_a_nats_server_lose_and_repeat_nothing(
    cluster: LocalCluster,
) -> None:
    api = Api(cluster.url, None, patience=30)
    wait_for(lambda: ready(api, "n1") and ready(api, "n2"), timeout=240)
    feed = Feed(cluster.nats_url, "CH_IN", "chin", replicas=3)
    api.call("POST", "/api/v1/pipelines", {"yaml": PIPELINE})
    wait_for(lambda: fragment(api)["status"] == "running", timeout=120)

    def events() -> int:
        return stored(cluster.nats_url, "CH_EVENTS")

    def some_progress() -> None:
        seen = events()
        wait_for(lambda: events() > seen + 50, timeout=120)

    some_progress()
    # 1. The agent running the fragment.
    kill_the_fragments_node(cluster, api)
    some_progress()
    # 2. The leader coordinator.
    leader = cluster.leader()
    assert leader is not None
    cluster.kill(leader)
    wait_for(lambda: cluster.leader() not in (None, leader), timeout=30)
    cluster.start_coordinator(leader)
    some_progress()
    # 3. The NATS server leading the sink stream's Raft group: while it re-elects, no
    # node is failed and nothing moves (heartbeats never wait on the broker).
    before = decisions(api)
    victim = stream_leader(cluster.nats_url, "CH_EVENTS")
    cluster._nats.servers[victim].kill()
    wait_for(lambda: stream_leader(cluster.nats_url, "CH_EVENTS") not in (None, victim), timeout=60)
    some_progress()
    assert decisions(api) == before, "a NATS server kill failed a node or moved a fragment"
    cluster._nats.restart(victim)
    wait_for(lambda: ready(api, "n1") and ready(api, "n2"), timeout=240)
    # 4. The other agent (now running the fragment).
    kill_the_fragments_node(cluster, api)
    some_progress()

    sent = feed.stop()
    assert_feed_exactly_once(cluster.nats_url, "CH_EVENTS", "CH_WINDOWS", sent)
