"""What the cluster demo sees of its pipeline's outputs: the latest windows, alerts,
global summaries, anomaly episodes and pattern matches, their counts, and a line for
each as it arrives (printed when the terminal cannot show the live view).

Anomaly episodes are scored against what the simulators injected
(:func:`spanflow.simulator.episode_report`): the demo's last line.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from datetime import UTC, datetime
from typing import Any

from spanflow.demo.pipelines import SITES
from spanflow.nats.streams import SyncNats
from spanflow.protocol.rest import Incident
from spanflow.simulator import (
    DetectedEpisode,
    EpisodeReport,
    InjectedEpisode,
    SensorSimulator,
    episode_report,
)

Row = dict[str, Any]


class ClusterFeed:
    def __init__(self, sims: list[SensorSimulator]) -> None:
        self.sims = sims
        self.windows: dict[str, deque[Row]] = {s: deque(maxlen=4) for s in SITES}
        self.alerts: deque[Row] = deque(maxlen=5)
        self.summaries: dict[str, deque[Row]] = {s: deque(maxlen=3) for s in SITES}
        self.anomalies: deque[Row] = deque(maxlen=6)
        self.episodes: dict[tuple[str, str, str], Row] = {}  # by (site, device, start)
        self.patterns: deque[Row] = deque(maxlen=5)
        self.counts = dict.fromkeys(("windows", "alerts", "global", "anomalies", "patterns"), 0)
        self.global_by_site = dict.fromkeys(SITES, 0)
        self.printed: deque[str] = deque()
        """A line per output, oldest first, until printed."""

    def subscribe(self, client: SyncNats) -> None:
        """Follow the pipeline's sinks on the hub's server."""
        handlers = {
            "patterns.>": self.on_pattern,
            "anomalies.>": self.on_anomaly,
            "windows.>": self.on_window,
            "alerts.>": self.on_alert,
            "global.>": self.on_global,
        }

        async def go() -> None:
            for subject, handle in handlers.items():
                await client.nc.subscribe(subject, cb=handle)

        client.run(go)

    async def on_window(self, msg: Any) -> None:
        r = json.loads(msg.data)
        self.counts["windows"] += 1
        self.windows[r["site"]].appendleft(r)
        self.printed.append(
            f"window {r['site']}/{r['device']} {span(r)} readings={r['readings']} "
            f"avg={r['avg_temperature']:.1f} max={r['max_temperature']:.1f}"
        )

    async def on_alert(self, msg: Any) -> None:
        r = with_latency(json.loads(msg.data))
        self.counts["alerts"] += 1
        self.alerts.appendleft(r)
        self.printed.append(
            f"ALERT {r['site']}/{r['device']} {r['reason']} "
            f"temperature={r['temperature']:.1f} vibration={r['vibration']:.2f} "
            f"at {r['ts'][11:23]}, alerted in {r['latency_ms']:.0f} ms"
        )

    async def on_global(self, msg: Any) -> None:
        r = json.loads(msg.data)
        self.counts["global"] += 1
        self.global_by_site[r["site"]] += 1
        self.summaries[r["site"]].appendleft(r)
        self.printed.append(
            f"GLOBAL {r['site']} window {span(r)} devices={r['devices']} "
            f"readings={r['readings']} avg={r['avg_temperature']:.1f} "
            f"max={r['max_temperature']:.1f}"
        )

    async def on_anomaly(self, msg: Any) -> None:
        r = json.loads(msg.data)
        self.episodes[(r["site"], r["device"], str(r["episode_start"]))] = r
        self.counts["anomalies"] += r["episode"] == "start"
        self.anomalies.appendleft(r)
        injected = self.injected_kind(r) or "-"
        where, start = f"{r['site']}/{r['device']}", str(r["episode_start"])[11:19]
        if r["episode"] == "start":
            self.printed.append(
                f"ANOMALY {where} episode started {start} score={r['peak_score']:.2f} "
                f"field={r['anomaly_field']} injected={injected}"
            )
        else:
            self.printed.append(
                f"ANOMALY {where} episode {start}–{str(r['episode_end'])[11:19]} over: "
                f"{r['anomalies']} anomalous readings, peak {r['peak_score']:.2f} "
                f"({r['anomaly_field']}), injected={injected}"
            )

    async def on_pattern(self, msg: Any) -> None:
        r = json.loads(msg.data)
        self.counts["patterns"] += 1
        self.patterns.appendleft(r)
        self.printed.append(
            f"PATTERN {r['site']}/{r['device']} {r['rule']} "
            f"{str(r['match_start'])[11:19]}–{str(r['match_end'])[11:19]} "
            f"peak={r['peak_temperature']:.1f} vibration={r['vibration']:.2f}"
        )

    def injected_kind(self, r: Row) -> str | None:
        """The kind of anomaly a simulator injected on this machine while the detected
        episode ``r`` went on (None: none)."""
        start = seconds(r["episode_start"])
        end = seconds(r["episode_end"]) if r["episode_end"] else start
        for sim in self.sims:
            for e in sim.stats.injected:
                same_machine = (e.site, e.device) == (r["site"], r["device"])
                if same_machine and start <= e.end + 2 and end >= e.start:
                    return str(e.kind)
        return None

    def detection_report(self) -> EpisodeReport:
        """The detected episodes (their last row each) scored against the injected ones."""
        detected = [
            DetectedEpisode(
                r["site"],
                r["device"],
                seconds(r["episode_start"]),
                seconds(r["episode_end"] or r["episode_start"]),
                r["anomalies"],
            )
            for r in self.episodes.values()
        ]
        return episode_report(detected, [e for sim in self.sims for e in sim.stats.injected])

    def summary(self, states: str) -> str:
        """The demo's closing line of figures."""
        c = self.counts
        return (
            f"demo finished: {sum(s.stats.sent for s in self.sims):,} readings, "
            f"{c['windows']} site windows, {c['alerts']} alerts, "
            f"{c['global']} global summaries; pipelines: {states}; "
            f"{c['anomalies']} anomaly episodes detected, {c['patterns']} pattern matches"
        )


def incident_report(
    incidents: list[Incident], injected: list[InjectedEpisode], slack: float = 30.0
) -> str:
    """How the dashboard's feed saw the injected overheats: the records it received in
    how many incidents, and how many overheats came out as at most one incident of each
    kind (an incident overlapping an overheat of its machine, ``slack`` seconds allowed
    for the way through the pipeline)."""
    overheats = [e for e in injected if e.kind == "overheat"]
    seen = single = 0
    for e in overheats:
        mine = [
            i
            for i in incidents
            if i.subject.endswith(f".{e.site}.{e.device}")
            and i.first_at <= e.end + slack
            and i.last_at >= e.start
        ]
        kinds = Counter(i.kind for i in mine)
        seen += bool(mine)
        single += bool(mine) and all(n == 1 for n in kinds.values())
    by_kind = Counter(i.kind for i in incidents)
    return (
        f"event feed: {sum(i.count for i in incidents):,} records in {len(incidents)} "
        f"incidents (anomaly {by_kind['anomaly']}, pattern {by_kind['pattern']}, alert "
        f"{by_kind['alert']}); {len(overheats)} injected overheats, {seen} seen, "
        f"{single} of them as one incident per kind"
    )


def seconds(value: Any) -> float:
    """An ISO timestamp as Unix seconds."""
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def span(r: Row) -> str:
    """A window's start to end, as hh:mm:ss."""
    return f"{r['window_start'][11:19]}–{r['window_end'][11:19]}"


def with_latency(alert: Row) -> Row:
    """The alert plus ``latency_ms``: from when the server stored its reading
    (``received``) to now, when the alert reached this subscriber."""
    stored = datetime.fromisoformat(str(alert["received"]).replace("Z", "+00:00"))
    if stored.tzinfo is None:
        stored = stored.replace(tzinfo=UTC)
    return {**alert, "latency_ms": (datetime.now(UTC) - stored).total_seconds() * 1000}
