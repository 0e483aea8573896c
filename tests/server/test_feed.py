"""The event feed's pure parts: which sinks feed it, the subjects it listens on, what
it keeps; and the dashboard's fragment history."""

from __future__ import annotations

import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.server.feed import EventFeed, Feed, feeds_of, subscription_subject
from spanflow.server.live import History

PIPELINE = """\
name: p
sources:
  - id: src
    stream: S
    subjects: ["s.>"]
    schema: {device: string, t: double, ts: timestamp}
    key: device
    event_time: ts
    to: [watch, seize, hot, plain]
processors:
  - {id: watch, type: detect_anomalies, fields: [t], to: [scored]}
  - {id: scored, type: filter, where: "is_anomaly", to: [anomalies_out]}
  - id: seize
    type: pattern
    pattern:
      within: 10s
      stages: [{stage: a, where: "t > 1"}, {stage: b, where: "t > 2"}]
    to: [patterns_out]
  - {id: hot, type: filter, where: "t > 50", to: [alerts_out]}
  - {id: plain, type: filter, where: "t > 0", to: [plain_out, quiet_out]}
sinks:
  - {id: anomalies_out, type: jetstream, stream: A, subject: "anomalies.{device}"}
  - {id: patterns_out, type: jetstream, stream: P, subject: "patterns.x{device}.end"}
  - {id: alerts_out, type: jetstream, stream: H, subject: "alerts.{device}", feed: alert}
  - {id: plain_out, type: jetstream, stream: O, subject: "out.{device}"}
  - {id: quiet_out, type: jetstream, stream: Q, subject: "q.{device}", feed: none}
"""


def test_sinks_feed_by_what_is_upstream_or_what_they_say() -> None:
    spec = load_pipeline_text(PIPELINE, "p.yaml")
    assert feeds_of(spec) == [
        Feed("anomalies_out", "anomalies.*", "anomaly"),  # a detector two steps up
        Feed("patterns_out", "patterns.*.end", "pattern"),
        Feed("alerts_out", "alerts.*", "alert"),  # said so
    ]  # plain_out: nothing to show; quiet_out: told not to


def test_subjects_listen_to_every_templated_token() -> None:
    assert subscription_subject("a.{site}.{device}") == "a.*.*"
    assert subscription_subject("fixed.subject") == "fixed.subject"


def test_the_feed_keeps_the_newest_shows_a_republished_record_once_and_filters() -> None:
    feed = EventFeed(kept=3)
    alert = Feed("alerts_out", "alerts.*", "alert")
    anomaly = Feed("anomalies_out", "anomalies.*", "anomaly")
    feed.add("p", alert, "alerts.d1", b'{"device": "d1", "note": "' + b"x" * 1000 + b'"}', "m1")
    feed.add("p", alert, "alerts.d1", b'{"device": "d1"}', "m1")  # replayed after a restart
    assert [e.seq for e in feed.events] == [1]
    assert len(feed.events[0].data["note"]) == 301  # abbreviated: 300 characters and "…"
    feed.add("p", anomaly, "anomalies.d2", b"not json", None)
    feed.add("q", anomaly, "anomalies.d3", b"[1, 2]", None)
    feed.add("q", alert, "alerts.d4", b"{}", "m2")
    assert [e.seq for e in feed.events] == [2, 3, 4]  # the newest three
    assert feed.events[0].data == {"raw": "not json"}
    assert feed.events[1].data == {"value": [1, 2]}
    assert [e.seq for e in feed.after(2)] == [3, 4]
    assert [e.seq for e in feed.after(kind="anomaly")] == [2, 3]
    assert [e.seq for e in feed.after(pipeline="q", limit=1)] == [4]


def test_history_keeps_recent_samples_of_reported_fragments_only() -> None:
    history = History(kept=2)

    def rt(fid: str, rows: int) -> FragmentRuntime:
        return FragmentRuntime(
            fragment_id=fid,
            epoch=1,
            status="running",
            rows_in=rows,
            input_rows_per_s=3.5,
            realtime_rows_per_s=2.0,
        )

    history.record({"a": rt("a", 1), "b": rt("b", 5)}, at=10.0)
    history.record({"a": rt("a", 2)}, at=12.0)  # b is gone (its pipeline was cancelled)
    history.record({"a": rt("a", 3)}, at=14.0)
    assert [s.rows_in for s in history.of(["a"])["a"]] == [2, 3]
    assert history.of(["b"]) == {"b": []}
    latest = history.latest()
    assert set(latest) == {"a"} and latest["a"].at == 14.0
    assert latest["a"].input_rows_per_s == 3.5  # micro-batch and real-time rows together
    # a fragment that cannot be reached keeps its samples and gets no new ones: its
    # chart stops where its node went silent
    history.record({}, at=16.0, known=["a"])
    assert [s.at for s in history.of(["a"])["a"]] == [12.0, 14.0]


def test_samples_carry_latency_percentiles_of_the_records_since_the_last_one() -> None:
    from spanflow.protocol.metrics import Histogram, QueryMetrics
    from spanflow.server.live import quantile

    assert quantile(0.5, [0] * 14) is None
    counts = [0] * 14
    counts[4] = 10  # ten observations between 50 and 100 ms
    assert quantile(0.5, counts) == pytest.approx(0.075)  # halfway in, as Prometheus does
    counts[-1] = 90  # and ninety above a minute: the highest bound stands for them
    assert quantile(0.99, counts) == 60.0

    def rt(*latencies: float, state: int = 0) -> FragmentRuntime:
        h = Histogram()
        for seconds in latencies:
            h.observe(seconds)
        q = QueryMetrics(latency_seconds=h, state_rows=state, state_bytes=10 * state)
        return FragmentRuntime(fragment_id="a", epoch=1, status="running", metrics={"out": q})

    history = History()
    history.record({"a": rt(0.2, 0.2, state=3)}, at=1.0)
    history.record({"a": rt(0.2, 0.2, 8.0, 8.0, state=5)}, at=3.0)  # two new, both slow
    history.record({"a": rt(0.2, 0.2, 8.0, 8.0, state=5)}, at=5.0)  # none new
    first, second, third = history.of(["a"])["a"]
    assert first.latency_p50_s is not None and first.latency_p50_s <= 0.25
    assert second.latency_p50_s is not None and 5.0 < second.latency_p50_s <= 10.0
    assert third.latency_p50_s is None and third.latency_p99_s is None
    assert (second.state_rows, second.state_bytes) == (5, 50)
    history.record({"a": rt(0.01)}, at=7.0)  # the fragment restarted: its counts began again
    assert history.of(["a"])["a"][-1].latency_p99_s == pytest.approx(0.00995)
