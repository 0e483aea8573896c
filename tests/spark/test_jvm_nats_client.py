"""The real-time jar's NATS client (a wrapper over jnats), called as its readers and
writers call it: a publish JetStream stores, and one no stream captures, told apart by
what the failure is, not by its text."""

from __future__ import annotations

from typing import Any

import pytest
from py4j.java_gateway import get_field
from py4j.protocol import Py4JJavaError

from spanflow.spark.connectors.jetstream import realtime
from tests.helpers import publish, read_all


def _client(spark: Any, url: str) -> Any:
    realtime.share_identity(spark)
    return spark._jvm.dev.spanflow.realtime.NatsClient.connect(url, "probe")


def _await(spark: Any, ack: Any) -> Any:
    nats_client = spark._jvm.dev.spanflow.realtime.NatsClient
    return getattr(nats_client, "await")(ack, 10_000, "a probe")  # a Python keyword


def test_a_publish_to_a_stream_is_acknowledged_with_its_sequence(
    spark: Any, nats_url: str, uid: str
) -> None:
    publish(nats_url, f"JC_{uid}", f"jc{uid}.first", [b"{}"])  # makes the stream
    client = _client(spark, nats_url)
    try:
        ack = _await(spark, client.publishToStream(f"jc{uid}.x", None, bytearray(b"{}")))
        assert get_field(ack, "stream") == f"JC_{uid}" and get_field(ack, "seq") == 2
    finally:
        client.close()
    assert len(read_all(nats_url, f"JC_{uid}")) == 2


def test_a_publish_no_stream_captures_fails_as_no_stream(
    spark: Any, nats_url: str, uid: str
) -> None:
    client = _client(spark, nats_url)
    try:
        future = client.publishToStream(f"nostream{uid}.x", None, bytearray(b"{}"))
        with pytest.raises(Py4JJavaError) as failed:
            _await(spark, future)
    finally:
        client.close()
    java = failed.value.java_exception
    assert java.getClass().getName() == "dev.spanflow.realtime.NatsClient$NoStream", str(java)
    assert f"nostream{uid}.x" in str(java.getMessage())
