"""The dashboard's event feed: anomalies, pattern matches and alerts as pipelines write
them.

Which sinks feed it is decided from the pipeline alone (:func:`feeds_of`, pure): a
JetStream sink's ``feed`` if set, else ``anomaly`` when a detect_anomalies step is
upstream, ``pattern`` when a pattern step is. :class:`EventFeed` (the I/O shell)
subscribes to those sinks' subjects on the coordinator's NATS connection — a core
subscription, so records published at an edge site arrive over the leaf link like any
other interest — and keeps the newest few hundred. It is a view: a record re-published
after a restart (same ``Nats-Msg-Id``) is shown once; nothing here is durable.

The same shell tallies what score steps predicted (:func:`score_feeds_of`,
:class:`Tally`): records per model version and their mean prediction — a canary's
split — and how often a shadow version agrees with production.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from spanflow.protocol.rest import DataEvent, ModelComparison, ShadowFigures, VersionFigures
from spanflow.server.incidents import Incidents
from spanflow.spec.steps.base import StepBase
from spanflow.spec.steps.io import SinkStep
from spanflow.spec.steps.models import DetectAnomaliesStep, ScoreStep
from spanflow.spec.steps.patterns import PatternStep

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

    from spanflow.spec.cluster import PipelineRecord
    from spanflow.spec.pipeline import PipelineSpec

FeedKind = Literal["anomaly", "pattern", "alert"]
KEPT = 500
MAX_VALUE = 300
"""Characters kept of one string value of a record (a feed shows, it does not store)."""
UPSTREAM: dict[type[StepBase], FeedKind] = {DetectAnomaliesStep: "anomaly", PatternStep: "pattern"}


@dataclass(frozen=True)
class Feed:
    sink: str
    subject: str
    """The subscription subject: the sink's subject with each templated token a ``*``."""
    kind: FeedKind


def subscription_subject(subject: str) -> str:
    """``anomalies.{site}.{device}`` → ``anomalies.*.*``: every subject the sink writes."""
    return ".".join("*" if "{" in token else token for token in subject.split("."))


def _upstream(spec: PipelineSpec, sink: SinkStep, kinds: tuple[type[StepBase], ...]) -> Any:
    """The nearest step of one of ``kinds`` upstream of ``sink`` (None: none)."""
    steps = {s.id: s for s in spec.steps}
    frontier, seen = list(sink.inputs), set()
    while frontier:
        step = steps.get(frontier.pop(0))
        if step is None or step.id in seen:
            continue
        seen.add(step.id)
        if isinstance(step, kinds):
            return step
        frontier.extend(step.inputs)
    return None


def _upstream_kind(spec: PipelineSpec, sink: SinkStep) -> FeedKind | None:
    """The nearest detect_anomalies or pattern step upstream of ``sink``, as a kind."""
    step = _upstream(spec, sink, tuple(UPSTREAM))
    return None if step is None else UPSTREAM[type(step)]


@dataclass(frozen=True)
class ScoreFeed:
    sink: str
    subject: str
    model: str


def score_feeds_of(spec: PipelineSpec) -> list[ScoreFeed]:
    """The JetStream sinks of ``spec`` that write what a score step predicted."""
    out = []
    for step in spec.steps:
        if isinstance(step, SinkStep) and step.nats_subject:
            score = _upstream(spec, step, (ScoreStep,))
            if score is not None:
                out.append(ScoreFeed(step.id, subscription_subject(step.nats_subject), score.model))
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return None


class Tally:
    """How one model's versions scored, from the records its score steps wrote."""

    def __init__(self) -> None:
        self.records = 0
        self.by_version: dict[str, list[float]] = {}  # version → [count, numeric count, sum]
        self.compared = self.agree = self.numeric = 0
        self.abs_difference = 0.0
        self.shadow_versions: set[int] = set()

    def add(self, record: dict[str, Any]) -> None:
        self.records += 1
        version = str(record.get("model_version"))
        figures = self.by_version.setdefault(version, [0, 0, 0.0])
        figures[0] += 1
        value = _number(record.get("prediction"))
        if value is not None:
            figures[1] += 1
            figures[2] += value
        shadow = record.get("shadow_prediction")
        if shadow is None or record.get("shadow_version") is None:
            return
        self.shadow_versions.add(int(record["shadow_version"]))
        self.compared += 1
        self.agree += int(shadow == record.get("prediction"))
        other = _number(shadow)
        if value is not None and other is not None:
            self.numeric += 1
            self.abs_difference += abs(value - other)

    def comparison(self, model: str) -> ModelComparison:
        versions = {
            v: VersionFigures(records=int(n), mean_prediction=(total / k) if k else None)
            for v, (n, k, total) in sorted(self.by_version.items())
        }
        shadow = (
            ShadowFigures(
                compared=self.compared,
                agreement=self.agree / self.compared,
                mean_abs_difference=self.abs_difference / self.numeric if self.numeric else None,
                versions=sorted(self.shadow_versions),
            )
            if self.compared
            else None
        )
        return ModelComparison(model=model, records=self.records, versions=versions, shadow=shadow)


def feeds_of(spec: PipelineSpec) -> list[Feed]:
    """The sinks of ``spec`` whose records the event feed shows."""
    out = []
    for step in spec.steps:
        if not isinstance(step, SinkStep) or not step.nats_subject or step.feed == "none":
            continue
        kind = step.feed or _upstream_kind(spec, step)
        if kind is not None:
            out.append(Feed(step.id, subscription_subject(step.nats_subject), kind))
    return out


def abbreviated(record: Any) -> dict[str, Any]:
    """The record as the feed shows it: a JSON object, long strings cut."""
    if not isinstance(record, dict):
        return {"value": record}
    return {
        k: (v[:MAX_VALUE] + "…" if isinstance(v, str) and len(v) > MAX_VALUE else v)
        for k, v in record.items()
    }


class EventFeed:
    """The newest :data:`KEPT` feed events, from subscriptions kept in step with the
    running pipelines by :meth:`sync`."""

    def __init__(self, kept: int = KEPT) -> None:
        self.events: deque[DataEvent] = deque(maxlen=kept)
        self.seq = 0
        self.counts: dict[tuple[str, str], int] = {}
        """(pipeline, kind) → events received since this coordinator started."""
        self.tallies: dict[str, Tally] = {}
        """model → how its versions scored (records after its score steps)."""
        self.incidents = Incidents()
        """The same records grouped as incidents (what the dashboard lists)."""
        self._subs: dict[tuple[str, str, str], Subscription] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()

    def add(self, pipeline: str, feed: Feed, subject: str, data: bytes, msg_id: str | None) -> None:
        if msg_id is not None and self._seen_before(msg_id):
            return  # the same record, re-published after a restart
        try:
            record = orjson.loads(data)
        except orjson.JSONDecodeError:
            record = {"raw": data[:MAX_VALUE].decode(errors="replace")}
        self.seq += 1
        key = (pipeline, feed.kind)
        self.counts[key] = self.counts.get(key, 0) + 1
        event = DataEvent(
            seq=self.seq,
            at=time.time(),
            pipeline=pipeline,
            sink=feed.sink,
            kind=feed.kind,
            subject=subject,
            data=abbreviated(record),
        )
        self.events.append(event)
        self.incidents.add(event)

    def _seen_before(self, msg_id: str) -> bool:
        """Whether ``msg_id`` came before (remembers the last few thousand)."""
        if msg_id in self._seen:
            return True
        self._seen[msg_id] = None
        if len(self._seen) > 8 * KEPT:
            self._seen.popitem(last=False)
        return False

    def after(
        self,
        seq: int = 0,
        *,
        kind: str | None = None,
        pipeline: str | None = None,
        limit: int = 200,
    ) -> list[DataEvent]:
        """Events after ``seq`` (oldest first), the newest ``limit`` of them."""
        found = [
            e
            for e in self.events
            if e.seq > seq
            and (kind is None or e.kind == kind)
            and (pipeline is None or e.pipeline == pipeline)
        ]
        return found[-limit:]

    async def sync(self, nc: Client, pipelines: Iterable[PipelineRecord]) -> None:
        """Subscribe to the feeds of running pipelines; drop those of the rest."""
        wanted: dict[tuple[str, str, str], Feed | ScoreFeed] = {}
        for p in pipelines:
            if p.state.terminal:
                continue
            for feed in feeds_of(p.spec):
                wanted[(p.name, p.run_id, feed.sink)] = feed
            for score in score_feeds_of(p.spec):
                wanted[(p.name, p.run_id, f"{score.sink}#score")] = score
        for key in set(self._subs) - set(wanted):
            await self._subs.pop(key).unsubscribe()
        for key in set(wanted) - set(self._subs):
            want = wanted[key]
            handler = (
                self._score_handler(want)
                if isinstance(want, ScoreFeed)
                else self._handler(key[0], want)
            )
            self._subs[key] = await nc.subscribe(want.subject, cb=handler)

    def _handler(self, pipeline: str, feed: Feed) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            msg_id = (msg.headers or {}).get("Nats-Msg-Id")
            self.add(pipeline, feed, msg.subject, msg.data, msg_id)

        return on_message

    def _score_handler(self, feed: ScoreFeed) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            msg_id = (msg.headers or {}).get("Nats-Msg-Id")
            if msg_id is not None and self._seen_before(f"score:{msg_id}"):
                return
            try:
                record = orjson.loads(msg.data)
            except orjson.JSONDecodeError:
                return
            if isinstance(record, dict):
                self.tallies.setdefault(feed.model, Tally()).add(record)

        return on_message

    def comparison(self, model: str) -> ModelComparison:
        return self.tallies.get(model, Tally()).comparison(model)

    async def close(self) -> None:
        for sub in self._subs.values():
            await sub.unsubscribe()
        self._subs.clear()
