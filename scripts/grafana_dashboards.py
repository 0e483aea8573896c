"""Write the Grafana dashboards spanflow ships (``deploy/grafana/*.json``).

The dashboards are generated so that every panel's query is written once, here, and
``tests/web/test_prometheus.py`` runs every one of them against a real Prometheus
scraping a running cluster. Import the JSON files in Grafana (Dashboards → Import) and
pick the Prometheus data source that scrapes the coordinators (deploy/prometheus).

    python3 scripts/grafana_dashboards.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana"

Panel = tuple[str, str, str, str]  # title, PromQL, legend, unit


def p99(metric: str, by: str) -> str:
    return f"histogram_quantile(0.99, sum by (le, {by}) (rate({metric}_bucket[1m])))"


def p50(metric: str, by: str) -> str:
    return f"histogram_quantile(0.5, sum by (le, {by}) (rate({metric}_bucket[1m])))"


DASHBOARDS: dict[str, tuple[str, list[Panel]]] = {
    "overview": (
        "spanflow — overview",
        [
            ("Nodes by state", "sum by (state) (spanflow_nodes)", "{{state}}", "short"),
            ("Pipelines running", "sum by (pipeline) (spanflow_pipeline_state{state=\"running\"})", "{{pipeline}}", "short"),
            ("Records in / s", "sum by (pipeline) (rate(spanflow_fragment_source_records_in_total[1m]))", "{{pipeline}}", "ops"),
            ("Records out / s", "sum by (pipeline) (rate(spanflow_query_records_out_total[1m]))", "{{pipeline}}", "ops"),
            ("End-to-end latency p99", p99("spanflow_query_latency_seconds", "pipeline"), "{{pipeline}}", "s"),
            ("Latency estimate", "spanflow_pipeline_latency_estimate_seconds", "{{pipeline}}", "s"),
            ("Dead letters (5 min)", "sum by (pipeline) (increase(spanflow_fragment_dead_letters_total[5m]))", "{{pipeline}}", "short"),
            ("Leader", "spanflow_coordinator_leader", "{{replica}}", "short"),
            ("Leader epoch", "spanflow_leader_epoch", "epoch", "short"),
            ("Slots used / slots", "spanflow_slots_used / spanflow_slots", "utilisation", "percentunit"),
        ],
    ),
    "nodes": (
        "spanflow — nodes and sites",
        [
            ("Node up", "spanflow_node_up", "{{node}} ({{site}})", "short"),
            ("CPU", "spanflow_node_cpu_ratio", "{{node}}", "percentunit"),
            ("Memory", "spanflow_node_memory_ratio", "{{node}}", "percentunit"),
            ("Load score", "spanflow_node_load_ratio", "{{node}}", "percentunit"),
            ("Fragments / slots", "spanflow_node_fragments / spanflow_node_slots", "{{node}}", "percentunit"),
            ("Heard (seconds ago)", "spanflow_node_heartbeat_age_seconds", "{{node}}", "s"),
            ("Site up", "spanflow_site_up", "{{site}}", "short"),
            ("Link latency", "spanflow_link_latency_seconds", "{{site_a}} ↔ {{site_b}}", "s"),
            ("Stream bytes", "spanflow_stream_bytes", "{{node}} {{stream}}", "bytes"),
            ("Stream messages", "spanflow_stream_messages", "{{node}} {{stream}}", "short"),
        ],
    ),
    "checkpoints": (
        "spanflow — checkpoints and state",
        [
            ("Checkpoint duration p99", p99("spanflow_query_checkpoint_duration_seconds", "fragment"), "{{fragment}}", "s"),
            ("Checkpoint duration p50", p50("spanflow_query_checkpoint_duration_seconds", "fragment"), "{{fragment}}", "s"),
            ("State rows", "sum by (fragment) (spanflow_query_state_rows)", "{{fragment}}", "short"),
            ("State memory", "sum by (fragment) (spanflow_query_state_bytes)", "{{fragment}}", "bytes"),
            ("Batches / s", "sum by (fragment) (rate(spanflow_query_batches_total[1m]))", "{{fragment}}", "ops"),
            ("Restarts (5 min)", "sum by (fragment) (increase(spanflow_fragment_restarts_total[5m]))", "{{fragment}}", "short"),
        ],
    ),
    "backpressure": (
        "spanflow — backpressure",
        [
            ("Backpressure (batch / trigger)", "max by (fragment) (spanflow_query_backpressure_ratio)", "{{fragment}}", "percentunit"),
            ("Backlog (messages behind)", "spanflow_fragment_backlog_messages", "{{fragment}}", "short"),
            ("Batch duration p99", p99("spanflow_query_batch_duration_seconds", "fragment"), "{{fragment}}", "s"),
            ("Batch duration p50", p50("spanflow_query_batch_duration_seconds", "fragment"), "{{fragment}}", "s"),
            ("Watermark lag", "spanflow_fragment_watermark_lag_seconds", "{{fragment}}", "s"),
            ("Input rows / s", "rate(spanflow_fragment_records_in_total[1m])", "{{fragment}}", "ops"),
        ],
    ),
    "ml-cep": (
        "spanflow — anomalies, patterns and alerts",
        [
            ("Events (5 min) by kind", "sum by (kind) (increase(spanflow_feed_events_total[5m]))", "{{kind}}", "short"),
            ("Events / min by pipeline", "sum by (pipeline, kind) (rate(spanflow_feed_events_total[5m])) * 60", "{{pipeline}} {{kind}}", "short"),
            ("Anomalies seen", "sum by (pipeline) (spanflow_feed_events_total{kind=\"anomaly\"})", "{{pipeline}}", "short"),
            ("Detector state rows", "sum by (fragment) (spanflow_query_state_rows)", "{{fragment}}", "short"),
        ],
    ),
}  # fmt: skip


def panel(i: int, title: str, expr: str, legend: str, unit: str) -> dict[str, Any]:
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [{"refId": "A", "expr": expr, "legendFormat": legend}],
    }


def dashboard(uid: str, title: str, panels: list[Panel]) -> dict[str, Any]:
    return {
        "uid": f"spanflow-{uid}",
        "title": title,
        "tags": ["spanflow"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                }
            ]
        },
        "panels": [panel(i, *p) for i, p in enumerate(panels)],
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for uid, (title, panels) in DASHBOARDS.items():
        path = OUT / f"spanflow-{uid}.json"
        path.write_text(json.dumps(dashboard(uid, title, panels), indent=2) + "\n")
        print(f"wrote {path.relative_to(OUT.parents[1])} ({len(panels)} panels)")


if __name__ == "__main__":
    main()
