"""Prometheus exposition of the coordinator's view, computed at scrape time.

A collector reads the live view on each scrape instead of keeping gauges in sync on
every change: nothing can drift, and a restarted coordinator exports the same series.
What agents measure (counters and histograms of each fragment's queries) arrives with
their heartbeats; one scrape of any coordinator replica sees the whole cluster.
docs/metrics.md lists every series, its labels and its meaning.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from spanflow.control.views import UNREACHABLE
from spanflow.protocol.metrics import FragmentRuntime, Histogram, QueryMetrics
from spanflow.spec.cluster import NodeState

if TYPE_CHECKING:
    from spanflow.control.coordinator import Coordinator
    from spanflow.protocol.messages import Heartbeat
    from spanflow.server.feed import EventFeed

FRAGMENT = ["pipeline", "fragment", "node"]
QUERY = [*FRAGMENT, "query"]


class _ClusterCollector(Collector):
    def __init__(self, coordinator: Coordinator, feed: EventFeed | None) -> None:
        self.coordinator = coordinator
        self.feed = feed
        self._live: dict[str, FragmentRuntime] = {}

    def collect(self) -> Iterator[Metric]:
        self._live = self.coordinator.view.live_runtimes()
        yield from self._cluster()
        yield from self._control_plane()
        yield from self._nodes()
        yield from self._sites()
        yield from self._pipelines()
        yield from self._fragments()
        yield from self._queries()
        yield from _stream_metrics(self.coordinator.observed.heartbeats.values())
        if self.feed is not None:
            yield from _feed_metrics(self.feed)

    # -- the cluster as a whole -----------------------------------------------------------
    def _cluster(self) -> Iterator[Metric]:
        summary = self.coordinator.view.cluster_metrics()
        nodes = GaugeMetricFamily("spanflow_nodes", "Nodes by state", labels=["state"])
        for state, n in summary.nodes.items():
            nodes.add_metric([state], n)
        yield nodes
        pipelines = GaugeMetricFamily("spanflow_pipelines", "Pipelines by state", labels=["state"])
        for state, n in summary.pipelines.items():
            pipelines.add_metric([state], n)
        yield pipelines
        yield GaugeMetricFamily("spanflow_slots", "Fragment slots on live nodes", summary.slots)
        yield GaugeMetricFamily(
            "spanflow_slots_used", "Fragment slots the assigned fragments take", summary.slots_used
        )
        yield GaugeMetricFamily(
            "spanflow_slots_used_ratio", "Slots used / slots of live nodes", summary.utilisation
        )

    def _control_plane(self) -> Iterator[Metric]:
        c = self.coordinator
        leading = GaugeMetricFamily(
            "spanflow_coordinator_leader",
            "1 when this coordinator replica leads, else 0",
            labels=["replica"],
        )
        leading.add_metric([c.settings.name], 1.0 if c.leading else 0.0)
        yield leading
        yield GaugeMetricFamily(
            "spanflow_leader_epoch", "The leader's epoch (grows by one per election)",
            c.state.leader_epoch,
        )  # fmt: skip
        yield CounterMetricFamily(
            "spanflow_elections", "Leaders elected since the cluster began (= the epoch)",
            c.state.leader_epoch,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "spanflow_control_log_records", "Control-log records applied (its sequence)",
            c.state.applied,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "spanflow_control_log_recovered_records",
            "Control-log records this replica replayed when it started",
            c.recovered_records,
        )

    # -- nodes and sites ------------------------------------------------------------------
    def _nodes(self) -> Iterator[Metric]:
        c = self.coordinator
        labels = ["node", "site"]
        up = GaugeMetricFamily(
            "spanflow_node_up", "1 when the node is alive and heard within two heartbeats",
            labels=labels,
        )  # fmt: skip
        cpu = GaugeMetricFamily(
            "spanflow_node_cpu_ratio", "CPU its agent and children use over the cores it offers",
            labels=labels,
        )  # fmt: skip
        memory = GaugeMetricFamily(
            "spanflow_node_memory_ratio", "Memory in use over the node's (0-1)", labels=labels
        )
        load = GaugeMetricFamily(
            "spanflow_node_load_ratio",
            "Load score its agent reports: 0 idle, 1 full, above 1 overloaded",
            labels=labels,
        )
        slots = GaugeMetricFamily("spanflow_node_slots", "Fragment slots", labels=labels)
        fragments = GaugeMetricFamily(
            "spanflow_node_fragments", "Fragments assigned to the node", labels=labels
        )
        heard = GaugeMetricFamily(
            "spanflow_node_heartbeat_age_seconds", "Seconds since the node was heard",
            labels=labels,
        )  # fmt: skip
        rejected = CounterMetricFamily(
            "spanflow_gossip_rejected_packets",
            "Gossip packets a node's keyring did not open (forged or wrong key)",
            labels=["node"],
        )
        for status in c.view.node_statuses():  # one reach for every node, not one each
            name = status.name
            values = [name, status.spec.site]
            up.add_metric(values, 1.0 if status.health in ("alive", "last-known") else 0.0)
            slots.add_metric(values, status.slots)
            fragments.add_metric(values, len(status.fragments))
            if status.last_heartbeat_s is not None:
                heard.add_metric(values, status.last_heartbeat_s)
            hb = c.observed.heartbeats.get(name)
            if hb is None or status.health in UNREACHABLE:
                continue  # no last figures of a node that cannot be heard
            cpu.add_metric(values, hb.cpu_percent / 100.0)
            memory.add_metric(values, hb.memory_percent / 100.0)
            if hb.load is not None:
                load.add_metric(values, hb.load)
            rejected.add_metric([name], hb.gossip_rejected)
        yield from (up, cpu, memory, load, slots, fragments, heard, rejected)

    def _sites(self) -> Iterator[Metric]:
        state = self.coordinator.state
        up = GaugeMetricFamily(
            "spanflow_site_up", "1 when at least one node of the site is alive", labels=["site"]
        )
        alive: dict[str, bool] = {s.name: False for s in state.topology.sites}
        for n in state.nodes.values():
            alive[n.spec.site] = alive.get(n.spec.site, False) or n.state == NodeState.ALIVE
        for site, yes in sorted(alive.items()):
            up.add_metric([site], 1.0 if yes else 0.0)
        yield up
        latency = GaugeMetricFamily(
            "spanflow_link_latency_seconds", "One-way latency of a link between two sites",
            labels=["site_a", "site_b"],
        )  # fmt: skip
        for link in state.topology.links:
            latency.add_metric(list(link.between), link.latency)
        yield latency

    # -- pipelines, fragments, queries ----------------------------------------------------
    def _pipelines(self) -> Iterator[Metric]:
        c = self.coordinator
        state = GaugeMetricFamily(
            "spanflow_pipeline_state", "1 for the state the pipeline is in",
            labels=["pipeline", "state"],
        )  # fmt: skip
        estimate = GaugeMetricFamily(
            "spanflow_pipeline_latency_estimate_seconds",
            "Input-to-output latency the planner expects (network, triggers, batches)",
            labels=["pipeline"],
        )
        budget = GaugeMetricFamily(
            "spanflow_pipeline_latency_budget_seconds", "The pipeline's latency budget",
            labels=["pipeline"],
        )  # fmt: skip
        for status in c.view.pipeline_statuses():
            name = status.name
            state.add_metric([name, status.state.value], 1.0)
            if status.latency_estimate_s is not None:
                estimate.add_metric([name], status.latency_estimate_s)
            if status.latency_budget:
                budget.add_metric([name], status.latency_budget)
        yield from (state, estimate, budget)

    def _current(self) -> Iterator[tuple[list[str], FragmentRuntime]]:
        """(pipeline, fragment, node) and the runtime of every fragment that runs where
        it can be believed now (an unreachable node's last figures are not exported)."""
        for frag_id, rt in self._live.items():
            a = self.coordinator.state.assignments[frag_id]
            yield [a.fragment.pipeline, frag_id, a.node], rt

    def _fragments(self) -> Iterator[Metric]:
        def gauge(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=FRAGMENT)

        up = gauge(
            "spanflow_fragment_up",
            "1 when the fragment's queries all run on a node heard within two heartbeats",
        )
        rows = CounterMetricFamily(
            "spanflow_fragment_records_in",
            "Records it read, each once however many of its queries read it",
            labels=FRAGMENT,
        )
        own = CounterMetricFamily(
            "spanflow_fragment_source_records_in",
            "The part of records_in read from the pipeline's own sources (sum these per "
            "pipeline: a global fragment re-reading its edge fragments' output is not here)",
            labels=FRAGMENT,
        )
        dead = CounterMetricFamily(
            "spanflow_fragment_dead_letters", "Messages it dead-lettered", labels=FRAGMENT
        )
        late = CounterMetricFamily(
            "spanflow_fragment_late_records",
            "Of its dead letters, records too late for their windows",
            labels=FRAGMENT,
        )
        restarts = CounterMetricFamily(
            "spanflow_fragment_restarts", "Query restarts after failures", labels=FRAGMENT
        )
        lag = gauge("spanflow_fragment_backlog_messages", "Messages behind its input's end")
        batch = gauge("spanflow_fragment_last_batch_seconds", "Duration of the last micro-batch")
        watermark = gauge(
            "spanflow_fragment_watermark_lag_seconds", "Now minus its event-time watermark"
        )
        now = time.time()
        for pipeline, fragment, node in self.coordinator.view.planned_fragments():
            live = self._live.get(fragment)
            running = live is not None and live.status == "running"
            up.add_metric([pipeline, fragment, node or ""], 1.0 if running else 0.0)
        for values, rt in self._current():
            rows.add_metric(values, rt.rows_in)
            own.add_metric(values, rt.source_rows_in)
            dead.add_metric(values, rt.dead_letters)
            late.add_metric(values, rt.late_records)
            restarts.add_metric(values, rt.restarts)
            lag.add_metric(values, rt.lag)
            batch.add_metric(values, rt.last_batch_ms / 1000.0)
            behind = _watermark_lag(rt.watermark, now)
            if behind is not None:
                watermark.add_metric(values, behind)
        yield from (up, rows, own, dead, late, restarts, lag, batch, watermark)

    def _queries(self) -> Iterator[Metric]:
        def counter(name: str, text: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, text, labels=QUERY)

        def gauge(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=QUERY)

        def histogram(name: str, text: str) -> HistogramMetricFamily:
            return HistogramMetricFamily(name, text, labels=QUERY)

        records_in = counter("spanflow_query_records_in", "Records the query's batches read")
        records_out = counter("spanflow_query_records_out", "Records the query wrote")
        batches = counter("spanflow_query_batches", "Micro-batches the query ran")
        batch = histogram("spanflow_query_batch_duration_seconds", "Micro-batch durations")
        latency = histogram(
            "spanflow_query_latency_seconds",
            "End to end, input record published to output record published (records "
            "that keep their source's _published; window results from their newest record)",
        )
        checkpoint = histogram(
            "spanflow_query_checkpoint_duration_seconds",
            "Checkpoint work per batch: offset and commit logs, state store commits",
        )
        state_rows = gauge("spanflow_query_state_rows", "Rows in the query's state stores")
        state_bytes = gauge("spanflow_query_state_bytes", "Memory its state stores use")
        pressure = gauge(
            "spanflow_query_backpressure_ratio",
            "Last batch duration / trigger interval (at 1 or more the query falls behind)",
        )
        for values, rt in self._current():
            for query, m in sorted(rt.metrics.items()):
                labels = [*values, query]
                records_in.add_metric(labels, m.records_in)
                if m.records_out is not None:
                    records_out.add_metric(labels, m.records_out)
                if m.latency_seconds.count:
                    _add_histogram(latency, labels, m.latency_seconds)
                if m.realtime:
                    continue  # one batch of minutes: no batch figures
                batches.add_metric(labels, m.batches)
                _add_histogram(batch, labels, m.batch_seconds)
                _add_histogram(checkpoint, labels, m.checkpoint_seconds)
                state_rows.add_metric(labels, m.state_rows)
                state_bytes.add_metric(labels, m.state_bytes)
                if m.trigger_seconds > 0:
                    pressure.add_metric(labels, _pressure(m))
        yield from (records_in, records_out, batches, batch, latency, checkpoint)
        yield from (state_rows, state_bytes, pressure)


def _pressure(m: QueryMetrics) -> float:
    return round(m.last_batch_seconds / m.trigger_seconds, 4)


def _add_histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    family.add_metric(labels, [(le, float(n)) for le, n in h.cumulative()], h.sum)


def _watermark_lag(watermark: str | None, now: float) -> float | None:
    if not watermark:
        return None
    try:
        at = datetime.fromisoformat(watermark.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    if at <= 0:  # Spark's watermark before the first event: 1970
        return None
    return max(0.0, now - at)


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


def _feed_metrics(feed: EventFeed) -> Iterator[Metric]:
    events = CounterMetricFamily(
        "spanflow_feed_events",
        "Anomalies, pattern matches and alerts this coordinator's event feed received",
        labels=["pipeline", "kind"],
    )
    for (pipeline, kind), n in sorted(feed.counts.items()):
        events.add_metric([pipeline, kind], n)
    yield events
    predictions = CounterMetricFamily(
        "spanflow_model_predictions",
        "Predictions each model version made (records after score steps)",
        labels=["model", "version"],
    )
    compared = CounterMetricFamily(
        "spanflow_model_shadow_compared",
        "Records scored by both production and a shadow version",
        labels=["model"],
    )
    agreement = GaugeMetricFamily(
        "spanflow_model_shadow_agreement_ratio",
        "Share of shadow-scored records whose predictions equal production's",
        labels=["model"],
    )
    for model in sorted(feed.tallies):
        c = feed.comparison(model)
        for version, figures in c.versions.items():
            predictions.add_metric([model, version], figures.records)
        if c.shadow is not None:
            compared.add_metric([model], c.shadow.compared)
            if c.shadow.agreement is not None:
                agreement.add_metric([model], c.shadow.agreement)
    yield from (predictions, compared, agreement)


def render_metrics(coordinator: Coordinator, feed: EventFeed | None = None) -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ClusterCollector(coordinator, feed))
    return generate_latest(registry), CONTENT_TYPE_LATEST
