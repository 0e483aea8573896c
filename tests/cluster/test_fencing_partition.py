"""A partition: node n1 reaches NATS through a relay, which is cut while n1 runs a
fragment. The coordinator fails n1 and moves the fragment to n2 (epoch 2), which
resumes from the shared checkpoint. When the link returns, n1 — alive all along, its
Spark query still holding the fragment's state — must not write: its fence says epoch
2. The output stays exactly once and no message of epoch 1 follows one of epoch 2.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any
from urllib.parse import urlparse

import pytest

from spanflow.local.cluster import Api, LocalCluster
from spanflow.nats.fences import EPOCH_HEADER
from spanflow.nats.relay import WanRelay
from tests.cluster.conftest import StartCluster
from tests.helpers import publish, read_all, wait_for

pytestmark = pytest.mark.slow

TOPOLOGY = """\
sites: [{name: cloud, kind: cloud}]
nodes:
  - {name: n1, site: cloud, capabilities: {cores: 1, slots: 2}}
  - {name: n2, site: cloud, capabilities: {cores: 1, slots: 2}}
"""

PIPELINE = """\
name: fenced
trigger: 0.5s
sources:
  - {id: src, stream: PF_IN, subjects: ["pfin.>"], schema: {id: long}, to: [keep]}
processors:
  - {id: keep, type: filter, where: "id >= 0", to: [out]}
sinks:
  - {id: out, type: jetstream, stream: PF_OUT, subject: "pfout.x"}
"""


@pytest.fixture
def cluster(start_cluster: StartCluster) -> LocalCluster:
    return start_cluster(TOPOLOGY)


def fragment(api: Api) -> dict[str, Any]:
    return dict(api.call("GET", "/api/v1/pipelines/fenced")["fragments"][0])


def node(api: Api, name: str) -> dict[str, Any]:
    return dict(api.call("GET", f"/api/v1/nodes/{name}"))


def output(url: str) -> list[tuple[int, str]]:
    """(id, epoch that wrote it) of every stored output message, in stream order."""
    return [
        (json.loads(data)["id"], (headers or {}).get(EPOCH_HEADER, "?"))
        for headers, data, _ in read_all(url, "PF_OUT")
    ]


def feed(url: str, start: int, end: int) -> None:
    publish(url, "PF_IN", "pfin.x", [{"id": i} for i in range(start, end)])


def test_a_cut_off_writer_is_fenced_when_its_fragment_moved(cluster: LocalCluster) -> None:
    url = cluster.nats_url
    hub = urlparse(url)
    relay = WanRelay(hub.hostname or "127.0.0.1", hub.port or 4222).start()
    try:
        cluster.start_node("n1", nats=f"nats://127.0.0.1:{relay.port}")
        api = cluster.api()
        wait_for(lambda: node(api, "n1")["ready"], timeout=180)
        api.call("POST", "/api/v1/pipelines", {"yaml": PIPELINE})
        wait_for(lambda: fragment(api)["status"] == "running", timeout=120)
        assert fragment(api)["node"] == "n1"
        cluster.start_node("n2")
        wait_for(lambda: node(api, "n2")["ready"], timeout=180)
        feed(url, 0, 100)
        wait_for(lambda: len(output(url)) >= 100, timeout=60)

        relay.cut()  # n1 is alive but cannot reach NATS
        feed(url, 100, 200)
        wait_for(
            lambda: (f := fragment(api))["node"] == "n2" and f["status"] == "running",
            timeout=60,
        )
        assert fragment(api)["epoch"] == 2
        wait_for(lambda: len({i for i, _ in output(url)}) >= 200, timeout=60)

        feed(url, 200, 300)  # waiting for n1's query the moment its link returns
        wait_for(lambda: len({i for i, _ in output(url)}) >= 300, timeout=60)
        relay.restore()  # n1 comes back with its query and its state
        wait_for(lambda: node(api, "n1")["state"] == "alive", timeout=60)
        # n1 stops the stale fragment: fenced at its next batch, or told it was moved.
        wait_for(
            lambda: (
                node(api, "n1")["agent_fragments"].get("fenced.f0", {}).get("status")
                in (None, "fenced")
            ),
            timeout=60,
        )
    finally:
        relay.stop()
    stored = output(url)
    assert Counter(i for i, _ in stored) == Counter(range(300))  # exactly once
    first_new = next(n for n, (_, epoch) in enumerate(stored) if epoch == "2")
    assert all(epoch == "2" for _, epoch in stored[first_new:]), "epoch 1 wrote after epoch 2"
    log = (cluster.data_dir / "logs" / "node-n1.log").read_text(errors="replace")
    fenced = re.search(r"not writing|runs elsewhere|fragment fenced\.f0 stopped", log)
    assert fenced is not None, "n1 neither was fenced nor stopped its stale fragment"
    print(f"n1: {fenced.group(0)}")
