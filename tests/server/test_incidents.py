"""Incidents from feed events: grouping by key, quiet time and anomaly episodes."""

from __future__ import annotations

from typing import Any

from spanflow.protocol.rest import DataEvent
from spanflow.server.incidents import Incidents

SEQ = iter(range(1, 10_000))


def event(kind: str, subject: str, at: float, **data: Any) -> DataEvent:
    return DataEvent(
        seq=next(SEQ), at=at, pipeline="p", sink=f"{kind}s", kind=kind, subject=subject, data=data
    )  # type: ignore[arg-type]


def test_one_overheat_is_one_incident_per_kind_with_its_count() -> None:
    book = Incidents()
    for i in range(18):  # one overheat: an alert per reading, matches in the same second
        book.add(event("alert", "alerts.m1", 100.0 + i * 0.1, temperature=50.0 + i))
        book.add(event("pattern", "patterns.m1", 101.0, peak_temperature=60.0))
    book.add(event("alert", "alerts.m2", 101.0, temperature=47.0))  # another machine
    shown = {(i.kind, i.subject): i.count for i in book.newest()}
    assert shown == {
        ("alert", "alerts.m1"): 18,
        ("pattern", "patterns.m1"): 18,
        ("alert", "alerts.m2"): 1,
    }
    first = book.newest(kind="alert", limit=5)[-1]
    assert (first.first_at, first.last_at, first.latest["temperature"]) == (100.0, 101.7, 67.0)


def test_an_episode_is_one_incident_from_its_start_to_its_end_however_long() -> None:
    book = Incidents(quiet=60.0)
    start = event("anomaly", "anomalies.m1", 10.0, episode="start", peak_score=4.0,
                  anomaly_field="temperature", episode_start="2026-11-28T01:00:00Z")  # fmt: skip
    opened = book.add(start)
    assert opened.episode_open and not opened.ended and opened.started == "2026-11-28T01:00:00Z"
    assert book.shown(opened, now=5000.0).open  # an open episode is going however quiet
    end = event("anomaly", "anomalies.m1", 900.0, episode="end", peak_score=9.5,
                anomaly_field="vibration", episode_start="2026-11-28T01:00:00Z",
                episode_end="2026-11-28T01:14:00Z")  # fmt: skip
    closed = book.add(end)
    assert closed.id == opened.id and closed.count == 2 and closed.ended
    assert (closed.peak, closed.peak_field, closed.until) == (
        9.5,
        "vibration",
        "2026-11-28T01:14:00Z",
    )
    assert not book.shown(closed, now=901.0).open
    soon = book.add(event("anomaly", "anomalies.m1", 930.0, episode="start", peak_score=3.0))
    assert soon.id == closed.id and soon.episode_open  # flapping: still one incident
    book.add(event("anomaly", "anomalies.m1", 940.0, episode="end", peak_score=3.0))
    later = book.add(event("anomaly", "anomalies.m1", 2000.0, episode="start", peak_score=3.0))
    assert later.id != closed.id  # an episode long after is the next incident


def test_records_after_the_quiet_time_open_a_new_incident() -> None:
    book = Incidents(quiet=30.0)
    a = book.add(event("anomaly", "anomalies.m1", 0.0, anomaly_score=3.0))
    b = book.add(event("anomaly", "anomalies.m1", 29.0, anomaly_score=5.0))
    c = book.add(event("anomaly", "anomalies.m1", 60.0, anomaly_score=2.0))
    assert a.id == b.id != c.id and b.peak == 5.0 and c.peak == 2.0
    assert book.shown(c, now=89.0).open and not book.shown(c, now=91.0).open
    assert [i.id for i in book.changed_after(b.last_event)] == [c.id]


def test_only_the_newest_incidents_are_kept() -> None:
    book = Incidents(kept=3)
    for i in range(5):
        book.add(event("alert", f"alerts.m{i}", float(i)))
    assert [i.subject for i in book.newest()] == ["alerts.m4", "alerts.m3", "alerts.m2"]
    again = book.add(event("alert", "alerts.m0", 5.0))  # its old incident is gone
    assert again.count == 1 and len(book.newest()) == 3
