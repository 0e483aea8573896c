"""The local Kafka broker's KRaft cluster ids: what Kafka's storage tool accepts."""

from __future__ import annotations

import base64

from spanflow.local.kafka_broker import new_cluster_id


def test_a_cluster_id_never_starts_with_a_dash_and_is_sixteen_bytes() -> None:
    """An id starting with '-' made ``kafka-storage format -t -x…`` refuse ("expected
    one argument") one broker start in 64: every Kafka test of a CI run failed once.
    10,000 draws would hit that start about 156 times."""
    ids = [new_cluster_id() for _ in range(10_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
