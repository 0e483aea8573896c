"""The ``detect_anomalies`` step as a keyed processor: a detector and a threshold per
key (or one for the whole stream), kept as keyed state.

Each record is scored, then learnt from, in event-time order (arrival order without
event time); the threshold then decides, and learns the score. During a key's first
``warmup`` records scores are emitted but nothing is called an anomaly. With
``episodes`` the step emits anomaly episodes (:mod:`spanflow.ml.episodes`) instead
of records. A key rebaselined by an operator (:mod:`spanflow.ml.rebaseline`) forgets
its state and learns afresh from its next reading; a key whose normal was fitted from
history and promoted (:mod:`spanflow.ml.fitted`) starts from it, without a warm-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from spanflow.api.processor import Context, KeyedProcessor, Record, StateDeclarations
from spanflow.ml.detectors import Detector
from spanflow.ml.episodes import Episodes
from spanflow.ml.fitted import Fitted, choose, staged
from spanflow.ml.rebaseline import key_text, requested
from spanflow.ml.thresholds import Threshold

SCORE, FLAG, FIELD = "anomaly_score", "is_anomaly", "anomaly_field"
ADDED = {SCORE: "double", FLAG: "boolean", FIELD: "string?"}
SHADOW = {"shadow_score": "double?", "shadow_anomaly": "boolean?", "shadow_version": "long?"}
"""What ``shadow`` adds: the staging version's score of the record (its own alarm at 0.5)."""


class AnomalyDetection(KeyedProcessor):
    """Adds ``anomaly_score``, ``is_anomaly`` and ``anomaly_field`` to each record."""

    def __init__(
        self,
        *,
        detector: Callable[[], Detector],
        threshold: Callable[[], Threshold],
        warmup: int,
        only_anomalies: bool,
        event_time: str | None,
        hidden: tuple[str, ...] = (),
        episodes: Callable[[], Episodes] | None = None,
        rebaselines: Callable[[], Mapping[str, int]] | None = None,
        fitted: Callable[[], Mapping[str, Fitted | None]] | None = None,
        canary: float = 0.0,
        shadow: bool = False,
    ) -> None:
        self.detector = detector()
        self.episodes = episodes() if episodes is not None else None
        self.threshold = threshold()
        self.warmup = warmup
        self.only_anomalies = only_anomalies
        self.event_time = event_time
        self.hidden = frozenset(hidden)
        self._rebaselines = rebaselines
        self._generations: Mapping[str, int] | None = None
        self._fitted = fitted
        self._fitted_now: Mapping[str, Fitted | None] | None = None
        self.canary = canary
        self.shadow = shadow

    def init(self, state: StateDeclarations) -> None:
        # One JSON blob: a detector's state is nested plain data, read and written
        # once per key and batch
        self.state = state.value("detector", "binary")

    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        blob = self.state.get()
        saved: dict[str, Any] = orjson.loads(blob) if blob else {"n": 0, "d": None, "t": None}
        out: list[Record] = []
        shadowed = saved.get("s")  # the shadow chart's state, kept through restarts
        generation = requested(self.generations(), key)
        version, normal = choose(self.fitted(), key_text(key), self.canary)
        if generation > saved.get("g", 0):  # learn afresh online, whatever was fitted
            out = self._closed_episode(saved, rows)
            saved = {"n": 0, "d": None, "t": None, "g": generation, "mv": version}
        elif version != saved.get("mv"):  # a fitted normal came, changed or went
            out = self._closed_episode(saved, rows)
            saved = self._restarted(saved, version, normal)
        live = self.detector.load(saved["d"])
        limits = saved["t"] if saved["t"] is not None else self.threshold.empty()
        times = [row.get(self.event_time) for row in rows] if self.event_time else None
        verdicts = judge(
            self.detector, live, self.threshold, limits, rows, times, self.warmup, saved["n"]
        )
        state = {"n": saved["n"] + len(rows), "d": self.detector.save(live), "t": limits}
        for kept in ("g", "mv"):
            if saved.get(kept) is not None:
                state[kept] = saved[kept]
        shadows = self._shadow_scores(shadowed, state, key, rows, times) if self.shadow else None
        if self.episodes is not None:
            episode = saved.get("e") or self.episodes.empty()
            out += self._episode_rows(episode, rows, times, verdicts)
            state["e"] = episode
        else:
            for i, (row, (score, anomalous, field)) in enumerate(zip(rows, verdicts, strict=True)):
                if anomalous or not self.only_anomalies:
                    record = {k: v for k, v in row.items() if k not in self.hidden}
                    record[SCORE], record[FLAG], record[FIELD] = score, anomalous, field
                    if shadows is not None:
                        record.update(shadows[i])
                    out.append(record)
        self.state.set(orjson.dumps(state))
        yield from out

    def generations(self) -> Mapping[str, int]:
        """The step's rebaseline generations for this batch (read once per task)."""
        if self._generations is None:
            self._generations = self._rebaselines() if self._rebaselines is not None else {}
        return self._generations

    def fitted(self) -> Mapping[str, Fitted | None]:
        """The step's fitted normals for this batch (read once per task)."""
        if self._fitted_now is None:
            self._fitted_now = self._fitted() if self._fitted is not None else {}
        return self._fitted_now

    def _shadow_scores(
        self,
        shadowed: dict[str, Any] | None,
        state: dict[str, Any],
        key: Any,
        rows: list[Record],
        times: list[Any] | None,
    ) -> list[dict[str, Any]]:
        """The staging version's score of each record, from the key's own shadow chart
        (started from the version's normal for the key; none without one)."""
        version, normal = staged(self.fitted(), key_text(key))
        started = getattr(self.detector, "started", None)
        if version is None or started is None:
            return [dict.fromkeys(SHADOW) for _ in rows]
        shadow = shadowed or {}
        if shadow.get("mv") != version:
            shadow = {"mv": version, "d": started(normal)}
        live = self.detector.load(shadow["d"])
        out = []
        for i, row in enumerate(rows):
            score, _ = self.detector.step(live, row, times[i] if times is not None else None)
            out.append({"shadow_score": score, "shadow_anomaly": score >= 0.5,
                        "shadow_version": version})  # fmt: skip
        state["s"] = {"mv": version, "d": self.detector.save(live)}
        return out

    def _restarted(self, saved: dict[str, Any], version: int | None, normal: Any) -> dict[str, Any]:
        """A key's state started afresh: from its fitted normal (no warm-up: it is
        fitted), or learning online when its version has none."""
        fresh: dict[str, Any] = {"n": 0, "d": None, "t": None, "g": saved.get("g", 0)}
        started = getattr(self.detector, "started", None)
        if normal is not None and started is not None:
            fresh.update(n=self.warmup, d=started(normal))
        fresh["mv"] = version
        return fresh

    def _closed_episode(self, saved: dict[str, Any], rows: list[Record]) -> list[Record]:
        """The end row of the key's open episode, which a rebaseline closes (stamped
        with the first reading's event time: the episode ends before it)."""
        episode = saved.get("e")
        if self.episodes is None or not episode or not episode.get("open"):
            return []
        row = self.episodes.end(episode)
        if self.event_time:
            row[self.event_time] = rows[0].get(self.event_time) if rows else None
        return [row]

    def _episode_rows(
        self,
        episode: dict[str, Any],
        rows: list[Record],
        times: list[Any] | None,
        verdicts: list[tuple[float, bool, str | None]],
    ) -> list[Record]:
        """Start and end rows, each with the event time of the reading that gave it."""
        assert self.episodes is not None
        out = []
        for i, (score, anomalous, field) in enumerate(verdicts):
            at = times[i] if times is not None else None
            for row in self.episodes.step(episode, at, score, anomalous, field):
                if self.event_time:
                    row[self.event_time] = at
                out.append(row)
        return out


def judge(
    detector: Detector,
    live: Any,
    threshold: Threshold,
    limits: dict[str, Any],
    records: Sequence[Mapping[str, Any]],
    times: Sequence[datetime | None] | None,
    warmup: int,
    seen: int = 0,
) -> list[tuple[float, bool, str | None]]:
    """(score, anomalous, field) of each record, in order: the detector scores then
    learns; the threshold decides, then learns the score (from the second half of the
    warm-up on). ``seen`` records of the key
    came before these (for the warm-up)."""
    out = []
    for i, record in enumerate(records):
        score, field = detector.step(live, record, times[i] if times is not None else None)
        n = seen + i + 1
        # The first half of the warm-up trains the detector only: its first scores
        # (before it has seen the data) would set the threshold's bar too high
        flagged = threshold.step(limits, score) if n > warmup // 2 else False
        out.append((score, flagged and n > warmup, field))
    return out
