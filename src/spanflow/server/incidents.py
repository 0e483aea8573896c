"""Incidents: the event feed's records as an operator thinks of them.

A detector, a pattern or a limit writes a record per reading, per match or per episode
row; an operator wants one line per thing that happened. Records of the same pipeline,
sink and subject (a sink's subject names its key: ``alerts.{device}``) belong to one
incident while they keep coming — less than :data:`QUIET` seconds apart — and an anomaly
episode's start and end rows are one incident however long it lasts (an episode that
starts again within the quiet time joins the same incident). Each incident
keeps its first and last arrival, its event-time span, how many records it gathered,
its peak (an anomaly's highest score and the field of it) and its newest record.

Pure: :meth:`Incidents.add` takes one feed event and returns the incident it joined.

    >>> from spanflow.protocol.rest import DataEvent
    >>> def alert(seq, at):
    ...     return DataEvent(seq=seq, at=at, pipeline="p", sink="alerts", kind="alert",
    ...                      subject="alerts.m1", data={"temperature": 50.0 + seq})
    >>> book = Incidents()
    >>> [book.add(alert(i, 100.0 + i)).id for i in range(1, 4)]
    [1, 1, 1]
    >>> book.add(alert(4, 400.0)).id  # quiet for five minutes: a new incident
    2
    >>> [(i.id, i.count) for i in book.newest()]
    [(2, 1), (1, 3)]
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from spanflow.protocol.rest import DataEvent, Incident

QUIET = 60.0
"""Seconds without a record after which a key's next record opens a new incident."""
KEPT = 300
"""Incidents kept (the newest)."""
TIME_FIELDS = ("episode_start", "window_end", "match_end", "ts", "time", "timestamp")
"""Record fields taken as a record's event time, in this order of preference."""

Key = tuple[str, str, str]


class Incidents:
    """The newest :data:`KEPT` incidents, grouped from feed events as they arrive."""

    def __init__(self, quiet: float = QUIET, kept: int = KEPT) -> None:
        self.quiet = quiet
        self.kept = kept
        self._by_id: OrderedDict[int, Incident] = OrderedDict()
        self._current: dict[Key, int] = {}
        self._next_id = 1

    def add(self, event: DataEvent) -> Incident:
        """Fold ``event`` into its key's current incident, or open one."""
        key = (event.pipeline, event.sink, event.subject)
        current = self._by_id.get(self._current.get(key, 0))
        episode = event.data.get("episode")
        if current is None or not self._continues(current, event, episode):
            current = self._open(key, event)
        else:
            current = _joined(current, event)
        if episode == "end":
            current = current.model_copy(update={"episode_open": False, "ended": True})
        elif episode == "start":  # a new episode soon after the last: the same incident
            current = current.model_copy(update={"episode_open": True, "ended": False})
        self._by_id[current.id] = current
        self._by_id.move_to_end(current.id)
        while len(self._by_id) > self.kept:
            gone, _ = self._by_id.popitem(last=False)
            self._current = {k: v for k, v in self._current.items() if v != gone}
        return current

    def _continues(self, current: Incident, event: DataEvent, episode: Any) -> bool:
        """Whether ``event`` belongs to ``current``: an open episode's rows do; else a
        record within the quiet time of the last one (an episode that ended and one
        that starts again soon after are one incident, as a flapping alarm is)."""
        if current.episode_open and episode != "start":
            return True
        return event.at - current.last_at <= self.quiet

    def _open(self, key: Key, event: DataEvent) -> Incident:
        record = event.data
        where = event.model_dump(include={"pipeline", "sink", "kind", "subject"})
        span = {"first_at": event.at, "last_at": event.at}
        seqs = {"first_event": event.seq, "last_event": event.seq}
        told = {"started": event_time(record), "until": event_time(record, end=True)}
        peak = {"peak": peak_of(record), "peak_field": _peak_field(record)}
        state = {"episode_open": record.get("episode") == "start", "ended": False}
        own = {"id": self._next_id, "count": 1, "latest": record, "quiet_s": self.quiet}
        incident = Incident.model_validate(where | span | seqs | told | peak | state | own)
        self._next_id += 1
        self._current[key] = incident.id
        return incident

    def newest(
        self, *, kind: str | None = None, pipeline: str | None = None, limit: int = 200
    ) -> list[Incident]:
        """Incidents by their last record, newest first."""
        found = [
            i
            for i in reversed(self._by_id.values())
            if (kind is None or i.kind == kind) and (pipeline is None or i.pipeline == pipeline)
        ]
        return found[:limit]

    def changed_after(self, seq: int) -> list[Incident]:
        """Incidents that gathered a record after feed event ``seq`` (oldest first)."""
        return [i for i in self._by_id.values() if i.last_event > seq]

    def shown(self, incident: Incident, now: float) -> Incident:
        """The incident as answered at ``now``: whether it is still going (an episode
        not ended, or a record within the quiet time)."""
        going = not incident.ended and (
            incident.episode_open or now - incident.last_at <= self.quiet
        )
        return incident.model_copy(update={"open": going})


def _joined(current: Incident, event: DataEvent) -> Incident:
    peak, field = current.peak, current.peak_field
    new = peak_of(event.data)
    if new is not None and (peak is None or new > peak):
        peak, field = new, _peak_field(event.data) or field
    return current.model_copy(
        update={
            "last_at": event.at,
            "count": current.count + 1,
            "last_event": event.seq,
            "until": event_time(event.data, end=True) or current.until,
            "peak": peak,
            "peak_field": field,
            "latest": event.data,
        }
    )


def event_time(record: dict[str, Any], end: bool = False) -> str | None:
    """When the record happened, as it says (an episode's end row: ``episode_end``)."""
    if end and record.get("episode_end"):
        return str(record["episode_end"])
    for name in TIME_FIELDS:
        if record.get(name):
            return str(record[name])
    return None


def peak_of(record: dict[str, Any]) -> float | None:
    """An anomaly's score (an episode row's peak so far), else None."""
    for name in ("peak_score", "anomaly_score"):
        value = record.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _peak_field(record: dict[str, Any]) -> str | None:
    field = record.get("anomaly_field")
    return str(field) if field else None
