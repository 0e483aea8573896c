"""The dashboard's event feed: anomalies, pattern matches and alerts as pipelines write
them.

Which sinks feed it is decided from the pipeline alone (:func:`feeds_of`, pure): a
JetStream sink's ``feed`` if set, else ``anomaly`` when a detect_anomalies step is
upstream, ``pattern`` when a pattern step is. :class:`EventFeed` (the I/O shell)
subscribes to those sinks' subjects on the coordinator's NATS connection — a core
subscription, so records published at an edge site arrive over the leaf link like any
other interest — and keeps the newest few hundred. It is a view: a record re-published
after a restart (same ``Nats-Msg-Id``) is shown once; nothing here is durable.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from spanflow.protocol.rest import DataEvent
from spanflow.spec.steps.base import StepBase
from spanflow.spec.steps.io import SinkStep
from spanflow.spec.steps.models import DetectAnomaliesStep
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


def _upstream_kind(spec: PipelineSpec, sink: SinkStep) -> FeedKind | None:
    """The nearest detect_anomalies or pattern step upstream of ``sink``, as a kind."""
    steps = {s.id: s for s in spec.steps}
    frontier, seen = list(sink.inputs), set()
    while frontier:
        step = steps.get(frontier.pop(0))
        if step is None or step.id in seen:
            continue
        seen.add(step.id)
        kind = UPSTREAM.get(type(step))
        if kind is not None:
            return kind
        frontier.extend(step.inputs)
    return None


def feeds_of(spec: PipelineSpec) -> list[Feed]:
    """The sinks of ``spec`` whose records the event feed shows."""
    out = []
    for step in spec.steps:
        if not isinstance(step, SinkStep) or step.kind != "jetstream" or not step.subject:
            continue
        if step.feed == "none":
            continue
        kind = step.feed or _upstream_kind(spec, step)
        if kind is not None:
            out.append(Feed(step.id, subscription_subject(step.subject), kind))
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
        self._subs: dict[tuple[str, str, str], Subscription] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()

    def add(self, pipeline: str, feed: Feed, subject: str, data: bytes, msg_id: str | None) -> None:
        if msg_id is not None:
            if msg_id in self._seen:
                return  # the same record, re-published after a restart
            self._seen[msg_id] = None
            if len(self._seen) > 4 * self.events.maxlen:  # type: ignore[operator]
                self._seen.popitem(last=False)
        try:
            record = orjson.loads(data)
        except orjson.JSONDecodeError:
            record = {"raw": data[:MAX_VALUE].decode(errors="replace")}
        self.seq += 1
        key = (pipeline, feed.kind)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.events.append(
            DataEvent(
                seq=self.seq,
                at=time.time(),
                pipeline=pipeline,
                sink=feed.sink,
                kind=feed.kind,
                subject=subject,
                data=abbreviated(record),
            )
        )

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
        wanted: dict[tuple[str, str, str], Feed] = {}
        for p in pipelines:
            if p.state.terminal:
                continue
            for feed in feeds_of(p.spec):
                wanted[(p.name, p.run_id, feed.sink)] = feed
        for key in set(self._subs) - set(wanted):
            await self._subs.pop(key).unsubscribe()
        for key in set(wanted) - set(self._subs):
            self._subs[key] = await nc.subscribe(
                wanted[key].subject, cb=self._handler(key[0], wanted[key])
            )

    def _handler(self, pipeline: str, feed: Feed) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            msg_id = (msg.headers or {}).get("Nats-Msg-Id")
            self.add(pipeline, feed, msg.subject, msg.data, msg_id)

        return on_message

    async def close(self) -> None:
        for sub in self._subs.values():
            await sub.unsubscribe()
        self._subs.clear()
