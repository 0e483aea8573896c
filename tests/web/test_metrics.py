"""Metric values, not their presence: what the coordinator's /metrics says after a
known workload, against what was published and what the API reports."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from spanflow.local.cluster import LocalCluster
from tests.helpers import wait_for
from tests.web.conftest import client, publish

Samples = list[tuple[str, dict[str, str], float]]


def scrape(c: LocalCluster) -> Samples:
    """Every sample of one scrape (public reads: Prometheus needs no token here)."""
    text = httpx.get(f"{c.url}/metrics", timeout=10).raise_for_status().text
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series whose labels include ``labels``."""
    return sum(v for n, ls, v in samples if n == name and _has(ls, labels))


def _has(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


def test_records_in_and_out_are_what_was_published_and_what_passed(
    cluster: LocalCluster,
) -> None:
    watch = {"pipeline": "plant-watch"}
    before = scrape(cluster)
    read = {q: total(before, "spanflow_query_records_in_total", **watch, query=q)
            for q in ("alerts_out", "anomalies_out")}  # fmt: skip
    wrote = total(before, "spanflow_query_records_out_total", **watch, query="alerts_out")
    timed = total(before, "spanflow_query_latency_seconds_count", **watch, query="alerts_out")
    rows_before = client(cluster).pipeline("plant-watch").rows_in
    hot = [{"device": "m1", "temperature": 40.0 + i % 3} for i in range(10)]
    cool = [{"device": "m1", "temperature": 20.0 + i % 3} for i in range(30)]
    publish(cluster.nats_url, "SENSORS", "sensors.m1", hot + cool)

    seen: dict[str, float] = {}

    def caught_up() -> bool:
        now = scrape(cluster)
        for q in read:
            seen[q] = total(now, "spanflow_query_records_in_total", **watch, query=q)
        seen["out"] = total(now, "spanflow_query_records_out_total", **watch, query="alerts_out")
        return all(seen[q] >= read[q] + 40 for q in read) and seen["out"] >= wrote + 10

    try:
        wait_for(caught_up, timeout=90)
    except AssertionError:
        status = client(cluster).pipeline("plant-watch").model_dump_json()
        raise AssertionError(f"before {read} out {wrote}; now {seen}; {status}") from None
    after = scrape(cluster)
    for q in read:  # each sink's query reads every record once: no more, no fewer
        assert total(after, "spanflow_query_records_in_total", **watch, query=q) == read[q] + 40
    # the filter passed the ten hot readings, and only those
    assert total(after, "spanflow_query_records_out_total", **watch, query="alerts_out") == (
        wrote + 10
    )
    # each alert kept its reading's publish time: ten end-to-end latencies, all positive
    latencies = total(after, "spanflow_query_latency_seconds_count", **watch, query="alerts_out")
    assert latencies == timed + 10
    assert total(after, "spanflow_query_latency_seconds_sum", **watch, query="alerts_out") > 0
    # a histogram counts every batch its counter counts
    batches = total(after, "spanflow_query_batches_total", **watch, query="alerts_out")
    durations = total(
        after, "spanflow_query_batch_duration_seconds_count", **watch, query="alerts_out"
    )
    assert batches == durations > 0
    # the fragment's counter is the API's figure, and both count each reading once
    # though two sinks' queries read it
    api = client(cluster).pipeline_metrics("plant-watch")
    assert total(after, "spanflow_fragment_records_in_total", **watch) == api.rows_in
    assert client(cluster).pipeline("plant-watch").rows_in == api.rows_in == rows_before + 40


def test_a_dead_letter_increments_one_pipelines_counter_by_exactly_one(
    cluster: LocalCluster,
) -> None:
    watch = {"pipeline": "plant-watch"}
    before = scrape(cluster)
    dead = total(before, "spanflow_fragment_dead_letters_total", **watch)
    read = total(before, "spanflow_query_records_in_total", **watch, query="alerts_out")
    publish(cluster.nats_url, "SENSORS", "sensors.m2", [b"{not json"])
    wait_for(
        lambda: total(scrape(cluster), "spanflow_fragment_dead_letters_total", **watch) > dead,
        timeout=90,
    )
    # a good record after it: once it is read, the bad one is long past
    publish(cluster.nats_url, "SENSORS", "sensors.m2", [{"device": "m2", "temperature": 1.0}])
    wait_for(
        lambda: (
            total(scrape(cluster), "spanflow_query_records_in_total", **watch, query="alerts_out")
            >= read + 1
        ),
        timeout=60,
    )
    after = scrape(cluster)
    assert total(after, "spanflow_fragment_dead_letters_total", **watch) == dead + 1
    assert total(after, "spanflow_query_records_in_total", **watch, query="alerts_out") == read + 1


def test_cluster_and_control_plane_figures_match_the_api(cluster: LocalCluster) -> None:
    api = client(cluster)
    samples = scrape(cluster)
    info = api.cluster()
    assert total(samples, "spanflow_coordinator_leader", replica=info.name) == 1.0
    assert total(samples, "spanflow_leader_epoch") == info.leader_epoch
    assert total(samples, "spanflow_elections_total") == info.leader_epoch
    assert total(samples, "spanflow_control_log_records") >= info.log_sequence
    for n in api.nodes():
        labels = {"node": n.name, "site": n.spec.site}
        assert total(samples, "spanflow_node_slots", **labels) == n.slots
        assert total(samples, "spanflow_node_fragments", **labels) == len(n.fragments)
    assert total(samples, "spanflow_site_up", site="plant") == 1.0
    assert total(samples, "spanflow_link_latency_seconds", site_a="plant", site_b="cloud") == 0.025
    running = total(samples, "spanflow_pipeline_state", state="running")
    assert running == sum(1 for p in api.pipelines() if p.state == "running")


def test_every_exported_metric_is_documented(cluster: LocalCluster) -> None:
    text = httpx.get(f"{cluster.url}/metrics", timeout=10).raise_for_status().text
    exported = {f.name for f in text_string_to_metric_families(text)}
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(spanflow_[a-z_]+)", docs))
    # the parser names a counter without its _total; the docs name the series
    missing = {n for n in exported if n not in documented and f"{n}_total" not in documented}
    assert len(exported) > 40 and not missing, f"not in docs/metrics.md: {sorted(missing)}"


def test_every_exported_name_follows_prometheus_conventions(cluster: LocalCluster) -> None:
    """Base units, counters ending in _total, shares as ratios, no precomputed rates:
    a name that breaks a convention fails here before a dashboard is built on it."""
    text = httpx.get(f"{cluster.url}/metrics", timeout=10).raise_for_status().text
    families = list(text_string_to_metric_families(text))
    broken = []
    for f in families:
        name = f.name
        if not re.fullmatch(r"spanflow_[a-z][a-z0-9_]*[a-z0-9]", name):
            broken.append(f"{name}: not snake_case under spanflow_")
        if re.search(r"_(percent|pct|ms|millis|milliseconds|kb|mb|per_second|rate)$", name):
            broken.append(f"{name}: not a base unit (seconds, bytes, ratio) or a rate")
        if re.search(r"(utilisation|utilization|usage|load|cpu|memory)$", name):
            broken.append(f"{name}: a share without its unit (_ratio)")
        if f.type == "counter" and any(not s.name.endswith("_total") for s in f.samples):
            broken.append(f"{name}: a counter whose samples do not end in _total")
        if f.type == "histogram" and not name.endswith(("_seconds", "_bytes")):
            broken.append(f"{name}: a histogram without its unit")
        if f.type == "gauge" and name.endswith("_total"):
            broken.append(f"{name}: a gauge named like a counter")
    memory = [
        s.value for f in families for s in f.samples if s.name == "spanflow_node_memory_ratio"
    ]
    assert memory and all(0.0 <= v <= 1.0 for v in memory), memory  # ratios, not percent
    assert not broken, "\n".join(broken)


def test_window_results_carry_end_to_end_latency(cluster: LocalCluster) -> None:
    """A window's result times its way from the newest reading in it (when the source
    stored it) to its own publication: windows are charted and exported, not blank."""
    windows = {"pipeline": "plant-windows", "query": "windows_out"}
    before = total(scrape(cluster), "spanflow_query_latency_seconds_count", **windows)
    now = datetime.now(UTC)
    later = (now + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    publish(cluster.nats_url, "SENSORS", "sensors.w1", [{"device": "w1", "temperature": 5.0}])
    # a reading a minute ahead moves the watermark past the first one's window
    publish(
        cluster.nats_url,
        "SENSORS",
        "sensors.w2",
        [{"device": "w2", "temperature": 6.0, "ts": later}],
    )
    wait_for(
        lambda: total(scrape(cluster), "spanflow_query_latency_seconds_count", **windows) > before,
        timeout=90,
    )
    after = scrape(cluster)
    count = total(after, "spanflow_query_latency_seconds_count", **windows)
    assert total(after, "spanflow_query_latency_seconds_sum", **windows) > 0
    assert count == total(after, "spanflow_query_records_out_total", **windows)  # each timed
