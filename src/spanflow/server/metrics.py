"""Prometheus exposition of the coordinator's view, computed at scrape time.

A collector reads the live view on each scrape instead of keeping gauges in sync on
every change: nothing can drift, and a restarted coordinator exports the same series.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from spanflow.control.coordinator import Coordinator
    from spanflow.spec.cluster import Heartbeat


class _ClusterCollector(Collector):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def collect(self) -> Iterator[Metric]:
        observed = self.coordinator.observed
        summary = self.coordinator.cluster_metrics()
        nodes = GaugeMetricFamily("spanflow_nodes", "Nodes by state", labels=["state"])
        for state, n in summary.nodes.items():
            nodes.add_metric([state], n)
        yield nodes
        pipelines = GaugeMetricFamily("spanflow_pipelines", "Pipelines by state", labels=["state"])
        for state, n in summary.pipelines.items():
            pipelines.add_metric([state], n)
        yield pipelines
        yield GaugeMetricFamily(
            "spanflow_slots", "Fragment slots on live nodes", value=summary.slots
        )
        yield GaugeMetricFamily(
            "spanflow_slots_used", "Fragments assigned", value=summary.slots_used
        )
        yield GaugeMetricFamily(
            "spanflow_utilisation", "Assigned fragments / slots", value=summary.utilisation
        )
        cpu = GaugeMetricFamily("spanflow_node_cpu_percent", "Node CPU use", labels=["node"])
        rejected = CounterMetricFamily(
            "spanflow_gossip_rejected_packets",
            "Gossip packets a node's keyring did not open (forged or wrong key)",
            labels=["node"],
        )
        for name, hb in observed.heartbeats.items():
            cpu.add_metric([name], hb.cpu_percent)
            rejected.add_metric([name], hb.gossip_rejected)
        yield cpu
        yield rejected
        labels = ["pipeline", "fragment", "node"]
        rate = GaugeMetricFamily(
            "spanflow_fragment_input_rows_per_second", "Input rate per fragment", labels=labels
        )
        rows = GaugeMetricFamily(
            "spanflow_fragment_rows_in", "Rows read per fragment", labels=labels
        )
        lag = GaugeMetricFamily(
            "spanflow_fragment_lag", "Messages behind the stream end", labels=labels
        )
        dead = GaugeMetricFamily(
            "spanflow_fragment_dead_letters", "Messages dead-lettered", labels=labels
        )
        batch = GaugeMetricFamily(
            "spanflow_fragment_last_batch_ms", "Duration of the last micro-batch", labels=labels
        )
        for frag_id, rt in observed.runtime.items():
            a = self.coordinator.state.assignments.get(frag_id)
            if a is None:
                continue
            values = [a.fragment.pipeline, frag_id, a.node]
            rate.add_metric(values, rt.input_rows_per_s + rt.realtime_rows_per_s)
            rows.add_metric(values, rt.rows_in)
            lag.add_metric(values, rt.lag)
            dead.add_metric(values, rt.dead_letters)
            batch.add_metric(values, rt.last_batch_ms)
        yield from (rate, rows, lag, dead, batch)
        yield from _stream_metrics(observed.heartbeats.values())


def _stream_metrics(heartbeats: Iterable[Heartbeat]) -> Iterator[Metric]:
    """How full the streams each node uses are, against their limits."""
    labels = ["node", "stream"]
    size = GaugeMetricFamily("spanflow_stream_bytes", "Bytes held by a stream", labels=labels)
    limit = GaugeMetricFamily(
        "spanflow_stream_max_bytes", "A stream's size limit (absent: none)", labels=labels
    )
    messages = GaugeMetricFamily("spanflow_stream_messages", "Messages in a stream", labels=labels)
    full = GaugeMetricFamily(
        "spanflow_stream_usage_ratio", "bytes / max_bytes of a stream", labels=labels
    )
    for hb in heartbeats:
        for u in hb.streams:
            values = [hb.node, u.stream]
            size.add_metric(values, u.bytes)
            messages.add_metric(values, u.messages)
            if u.max_bytes:
                limit.add_metric(values, u.max_bytes)
                full.add_metric(values, u.ratio or 0.0)
    yield from (size, limit, messages, full)


def render_metrics(coordinator: Coordinator) -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ClusterCollector(coordinator))
    return generate_latest(registry), CONTENT_TYPE_LATEST
