"""Hot standby with a transactional Kafka sink on a real cluster (embedded NATS, the
coordinator, two agents with their own Spark, Apache Kafka): SIGKILL, twice, of the
machine of the replica that holds the sink's producer (the marker of the last batch
names it) while readings flow — the other follows its marker topic and takes the
writing over — leaves every reading in the topic exactly once for a
``read_committed`` consumer, with a short pause."""

from __future__ import annotations

import time
from collections import Counter

import orjson
import pytest

from spanflow.local.cluster import Api, LocalCluster
from spanflow.nats.relay import WanRelay
from spanflow.spark.connectors.kafka import TAKEOVER_AFTER, marker_topic
from tests.cluster.test_standby import (
    both_caught_up,
    cluster,  # noqa: F401 (fixture)
    links,  # noqa: F401 (fixture)
    longest_pause,
    replicas,
    start_node,
    wait_caught_up,
)
from tests.helpers import Feed, wait_for
from tests.kafka_helpers import create_topic, read_topic, record_times

pytestmark = [pytest.mark.slow, pytest.mark.solo]  # output-pause and takeover bounds

PIPELINE = """\
name: hot
trigger: 1s
standby: 1
sources:
  - id: src
    stream: CH_IN
    subjects: ["chin.>"]
    schema: {{device: string, ts: timestamp, id: long}}
    to: [keep]
processors:
  - {{id: keep, type: filter, where: "id >= 0", to: [out]}}
sinks:
  - {{id: out, type: kafka, topic: {topic}, bootstrap: "{bootstrap}"}}
"""

MAX_GAP = TAKEOVER_AFTER + 3.0
"""The follower waits TAKEOVER_AFTER for the dead writer's batch, then starts a producer
(fencing the writer, whose open transaction Kafka aborts: ≈1.3 s measured) and writes
it; plus the trigger and the batch."""


def writing_replica(kafka: str, topic: str) -> str:
    """The replica that wrote the sink's last batch (its marker says)."""
    markers = read_topic(kafka, marker_topic("hot", "out"))
    return str(orjson.loads(markers[-1][3])["by"])


def _kill_the_writer(
    c: LocalCluster, relays: dict[str, WanRelay], api: Api, kafka: str, topic: str
) -> float:
    """SIGKILL the machine of the replica whose producer writes; the longest pause in
    the topic from 1 s before to 12 s after; then the machine restarted and both
    replicas caught up."""
    f = writing_replica(kafka, topic)
    node = replicas(api)[f]["node"]
    killed_at = time.time()
    c.kill(f"node-{node}", tree=True)
    wait_for(lambda: (record_times(kafka, topic) or [0.0])[-1] > killed_at + 12, timeout=90)
    pause = longest_pause(record_times(kafka, topic), killed_at - 1.0, killed_at + 12.0)
    print(f"{f} on {node} killed: longest pause in the Kafka topic {pause:.2f} s")
    start_node(c, relays, node)
    wait_caught_up(api)
    return pause


@pytest.mark.timeout(1200)  # two catch-ups of up to CATCH_UP on a busy machine
def test_either_replicas_death_leaves_every_reading_once_in_kafka(
    cluster: LocalCluster,  # noqa: F811
    links: dict[str, WanRelay],  # noqa: F811
    kafka: str,
    uid: str,
) -> None:
    topic = f"hot-{uid}"
    create_topic(kafka, topic)
    for name in links:
        start_node(cluster, links, name)
    api = Api(cluster.url, None, patience=30)
    feed = Feed(cluster.nats_url, "CH_IN", "chin", rate=50)
    api.call("POST", "/api/v1/pipelines", {"yaml": PIPELINE.format(topic=topic, bootstrap=kafka)})
    wait_for(lambda: both_caught_up(api), timeout=240)
    wait_for(lambda: len(record_times(kafka, topic)) > 100, timeout=120)

    pauses, killed = [], []
    for _ in range(2):
        killed.append(writing_replica(kafka, topic))
        pauses.append(_kill_the_writer(cluster, links, api, kafka, topic))
    print(f"writers killed: {killed}")

    sent = feed.stop()
    wait_for(lambda: len(record_times(kafka, topic)) >= sent, timeout=120)
    ids = Counter(orjson.loads(r[3])["id"] for r in read_topic(kafka, topic))
    assert ids == Counter(range(sent)), (
        f"lost {len(set(range(sent)) - set(ids))}, "
        f"duplicated {sum(n - 1 for n in ids.values() if n > 1)}"
    )
    assert max(pauses) <= MAX_GAP, f"output paused {pauses} s when a replica died"
