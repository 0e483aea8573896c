"""The cluster demo's live view: the cluster's status, then a table per kind of output
(edge windows, anomaly episodes, pattern matches, global summaries, alerts)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Group, RenderableType
from rich.table import Table

from spanflow.demo.feed import ClusterFeed, Row, span
from spanflow.demo.pipelines import SITES


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], **style: str) -> Table:
    t = Table(title=title, **style)  # type: ignore[arg-type]
    for column in columns:
        t.add_column(column)
    for row in rows:
        t.add_row(*row)
    return t


def cluster_view(feed: ClusterFeed, status: RenderableType) -> Group:
    c = feed.counts
    windows = table(
        f"per-site 10 s windows at the edge ({c['windows']} so far)",
        ("site", "device", "window", "readings", "avg °C", "max °C"),
        (
            (site, r["device"], span(r), str(r["readings"]), *_temperatures(r))
            for site in SITES
            for r in feed.windows[site]
        ),
    )
    summaries = table(
        f"global summary in the cloud ({c['global']} so far)",
        ("site", "window", "devices", "readings", "avg °C", "max °C"),
        (
            (site, span(r), str(r["devices"]), str(r["readings"]), *_temperatures(r))
            for site in SITES
            for r in feed.summaries[site]
        ),
    )
    sent = sum(s.stats.sent for s in feed.sims)
    injected = sum(s.stats.anomalies for s in feed.sims)
    return Group(
        status,
        f"simulators: {sent:,} readings sent, {injected:,} anomalous",
        windows,
        _episodes(feed),
        _patterns(feed),
        summaries,
        _alerts(feed),
    )


def _temperatures(r: Row) -> tuple[str, str]:
    return f"{r['avg_temperature']:.1f}", f"{r['max_temperature']:.1f}"


ALERT_COLUMNS = ("device", "reading at", "reason", "°C", "vib", "alerted in")


def alert_cells(r: Row) -> tuple[str, ...]:
    """An alert as the demo's tables show it (the columns of :data:`ALERT_COLUMNS`)."""
    return (
        r["device"],
        r["ts"][11:23],
        r["reason"],
        f"{r['temperature']:.1f}",
        f"{r['vibration']:.2f}",
        f"{r['latency_ms']:.0f} ms",
    )


def _alerts(feed: ClusterFeed) -> Table:
    return table(
        f"real-time alerts ({feed.counts['alerts']} so far)",
        ("site", *ALERT_COLUMNS),
        ((r["site"], *alert_cells(r)) for r in feed.alerts),
        style="red",
    )


def _episodes(feed: ClusterFeed) -> Table:
    return table(
        f"anomaly episodes detected at the edge ({feed.counts['anomalies']} so far; "
        "a row when one starts and when it ends)",
        ("site", "device", "from", "to", "peak", "field", "anomalous", "injected"),
        (
            (
                r["site"],
                r["device"],
                str(r["episode_start"])[11:19],
                str(r["episode_end"])[11:19] if r["episode_end"] else "ongoing",
                f"{r['peak_score']:.2f}",
                str(r["anomaly_field"]),
                str(r["anomalies"]),
                feed.injected_kind(r) or "-",
            )
            for r in feed.anomalies
        ),
        style="magenta",
    )


def _patterns(feed: ClusterFeed) -> Table:
    return table(
        "overheat, then vibration within 30 s — event pattern per machine "
        f"({feed.counts['patterns']} so far)",
        ("site", "device", "from", "to", "peak °C", "vib"),
        (
            (
                r["site"],
                r["device"],
                str(r["match_start"])[11:19],
                str(r["match_end"])[11:19],
                f"{r['peak_temperature']:.1f}",
                f"{r['vibration']:.2f}",
            )
            for r in feed.patterns
        ),
        style="yellow",
    )
