"""Anomaly episodes: the alarms people act on.

A detector judges each reading; an operator wants to hear once that something is
wrong, and once that it is over. An *episode* of a key starts at its first anomalous
reading and goes on while anomalies keep coming; it ends when ``quiet`` has passed
without one — a number of the key's readings, or a span of event time. Two rows come
out of each: one when it starts, one when it ends.

The end is noticed when the key's next reading arrives after the quiet period (a
key that falls silent keeps its episode open until it speaks again).

    >>> tracker = Episodes(quiet_readings=3)
    >>> state = tracker.empty()
    >>> flags = [False, True, True, False, True, False, False, False, False]
    >>> rows = []
    >>> for i, flag in enumerate(flags):
    ...     rows += tracker.step(state, None, 0.9 if flag else 0.1, flag, "t")
    >>> [(r["episode"], r["anomalies"], r["readings"]) for r in rows]
    [('start', 1, 1), ('end', 3, 4)]
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

EPISODE_FIELDS = {
    "episode": "string",  # 'start' or 'end'
    "episode_start": "timestamp?",  # event time of its first anomaly
    "episode_end": "timestamp?",  # event time of its last anomaly (end rows)
    "peak_score": "double",  # the highest score in it so far
    "anomaly_field": "string?",  # the field of that score
    "anomalies": "long",  # anomalous readings in it so far
    "readings": "long",  # all readings from its first to its last anomaly
}
DEFAULT_QUIET_READINGS = 100


class Episodes:
    """Turns per-reading verdicts into start and end rows; the state is plain data."""

    def __init__(
        self, quiet_readings: int | None = None, quiet_seconds: float | None = None
    ) -> None:
        if quiet_readings is None and quiet_seconds is None:
            quiet_readings = DEFAULT_QUIET_READINGS
        self.quiet_readings = quiet_readings
        self.quiet_seconds = quiet_seconds

    def empty(self) -> dict[str, Any]:
        return {"open": False}

    def step(
        self,
        s: dict[str, Any],
        at: datetime | None,
        score: float,
        anomalous: bool,
        field: str | None,
    ) -> list[dict[str, Any]]:
        """The rows this reading gives: none, an end, a start, or an end and a start."""
        out = []
        if s["open"]:
            s["since"] += 1
            between = s["since"] - 1 if anomalous else s["since"]  # readings with no anomaly
            if self._quiet_over(s, at, between):
                out.append(self._row(s, "end"))
                s.clear()
                s["open"] = False
            elif anomalous:
                self._extend(s, at, score, field)
                return out
            else:
                return out
        if anomalous:
            s.update(
                open=True,
                start=_seconds(at),
                last=_seconds(at),
                peak=score,
                field=field,
                count=1,
                readings=1,
                since=0,
            )
            out.append(self._row(s, "start"))
        return out

    def end(self, s: dict[str, Any]) -> dict[str, Any]:
        """The end row of the open episode in ``s``, which is closed (an operator
        accepted the key's behaviour: :mod:`spanflow.ml.rebaseline`)."""
        row = self._row(s, "end")
        s.clear()
        s["open"] = False
        return row

    def _extend(
        self, s: dict[str, Any], at: datetime | None, score: float, field: str | None
    ) -> None:
        s["readings"] += s["since"]
        s["since"] = 0
        s["count"] += 1
        s["last"] = _seconds(at)
        if score > s["peak"]:
            s["peak"], s["field"] = score, field

    def _quiet_over(self, s: dict[str, Any], at: datetime | None, between: int) -> bool:
        """Whether the quiet period passed since the last anomaly, ``between``
        readings without one ago."""
        if self.quiet_seconds is not None and at is not None and s["last"] is not None:
            return at.timestamp() - s["last"] >= self.quiet_seconds
        return between >= (self.quiet_readings or DEFAULT_QUIET_READINGS)

    @staticmethod
    def _row(s: dict[str, Any], kind: str) -> dict[str, Any]:
        return {
            "episode": kind,
            "episode_start": _time(s["start"]),
            "episode_end": _time(s["last"]) if kind == "end" else None,
            "peak_score": s["peak"],
            "anomaly_field": s["field"],
            "anomalies": s["count"],
            "readings": s["readings"],
        }


def _seconds(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def _time(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds is not None else None
