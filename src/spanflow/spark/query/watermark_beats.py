"""Watermark beats: a site's fragment tells the cloud how far its event time has gone,
so that a site that sends nothing does not hold every merged window open forever.

A global step (a merge of the sites' partial windows, a join across sites) reads one
source per site, and Spark keeps the minimum of their watermarks — counting a source
that has never seen a row as 0. A site with no data at all (no device yet, a new
factory, a quiet line) therefore stopped every site's windows from closing in the
cloud. Now each site's fragment that writes a cut stream appends a small beat to it,
``{"_watermark": "<time>"}``, whenever it is caught up with its input and its
watermark has moved (at most every :data:`EVERY` seconds): every partial it will still
write ends after that time, so the cloud's source for the site takes the beat for its
watermark and drops it (as it drops its own heartbeats: the ``_heartbeat`` column).

A site whose query has never seen an event time is *idle* once it has been caught up
for :data:`IDLE_AFTER` seconds; its beats then carry the wall clock less that, as
Flink's idle sources do: a reading it sends later that is older than the cloud's
watermark is late there. A site that stops after sending data keeps its last
watermark (its open windows close only when its event time moves on).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from spanflow.protocol.names import CUT_SUBJECT_PREFIX
from spanflow.spark.query import progress
from spanflow.spec.steps.io import SinkStep

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from spanflow.nats.streams import SyncNats

log = logging.getLogger(__name__)

EVERY = 5.0
"""Seconds between one site fragment's beats at most."""

IDLE_AFTER = 30.0
"""Seconds a fragment that has never seen an event time must be caught up before its
site counts as idle."""

PREFIX = b'{"_watermark":'


def beat_body(at: datetime) -> bytes:
    """The beat message for a watermark of ``at``."""
    return orjson.dumps({"_watermark": at.astimezone(UTC).isoformat()})


def is_beat(subject: str, data: bytes) -> bool:
    """Whether a stored message is a beat: only on a cut subject, where agents alone
    publish (a device that sends the same bytes on its own subject sends a record, which
    decodes or is dead-lettered as any other, and moves no watermark)."""
    return subject.startswith(f"{CUT_SUBJECT_PREFIX}.") and data.startswith(PREFIX)


def beat_time(data: bytes) -> str | None:
    """The time a beat carries (ISO 8601), or None for a message that is not one."""
    try:
        value = orjson.loads(data).get("_watermark")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


@dataclass
class BeatPolicy:
    """When one query publishes a beat, and what time it carries (pure: the caller
    passes its clocks and the query's state)."""

    every: float = EVERY
    idle_after: float = IDLE_AFTER
    _last_at: float | None = None
    _last: datetime | None = None
    _caught_up_since: float | None = None

    def beat(
        self, now: float, wall: datetime, watermark: datetime | None, caught_up: bool
    ) -> datetime | None:
        """The time to publish now, or None. ``now`` is a monotonic clock, ``wall`` the
        wall clock, ``watermark`` the query's last batch's (None: it has seen no event
        time yet), ``caught_up`` whether that batch read everything its sources had."""
        if not caught_up:
            self._caught_up_since = None
            return None
        if self._caught_up_since is None:
            self._caught_up_since = now
        if self._last_at is not None and now - self._last_at < self.every:
            return None
        if watermark is not None:
            at = watermark
        elif now - self._caught_up_since >= self.idle_after:
            at = datetime.fromtimestamp(wall.timestamp() - self.idle_after, UTC)
        else:
            return None
        if self._last is not None and at <= self._last:
            return None
        self._last_at, self._last = now, at
        return at


def parse_watermark(value: str | None) -> datetime | None:
    """A query progress's ``eventTime.watermark`` (None or the epoch: none yet)."""
    if not value:
        return None
    at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None if at.timestamp() <= 0 else at


def writes_a_cut(sink: SinkStep) -> bool:
    """Whether ``sink`` hands a site fragment's output on to a global one."""
    return (sink.nats_subject or "").startswith(f"{CUT_SUBJECT_PREFIX}.")


class SiteBeats:
    """The beats of one runner's cut-writing queries (the I/O shell around
    :class:`BeatPolicy`): called from the runner's supervision, never raises."""

    def __init__(self, idle_after: float = IDLE_AFTER) -> None:
        self.idle_after = idle_after
        self.policies: dict[str, BeatPolicy] = {}

    def tick(self, client: SyncNats, queries: list[tuple[SinkStep, StreamingQuery]]) -> None:
        for sink, query in queries:
            if not writes_a_cut(sink) or not query.isActive:
                continue
            last: Any = query.lastProgress  # dict-like progress (None before a batch)
            event_time = (last or {}).get("eventTime") or {}
            if "watermark" not in event_time:  # no batch yet, or no event time at all
                continue
            policy = self.policies.setdefault(sink.id, BeatPolicy(idle_after=self.idle_after))
            at = policy.beat(
                time.monotonic(),
                datetime.now(UTC),
                parse_watermark(event_time["watermark"]),
                caught_up=progress.lag(last) == 0,
            )
            if at is not None:
                self._publish(client, sink, at)

    def _publish(self, client: SyncNats, sink: SinkStep, at: datetime) -> None:
        subject, body = sink.subject or "", beat_body(at)
        try:
            client.run(lambda: client.js.publish(subject, body), timeout=5.0)
        except Exception as exc:  # the next beat carries as much: never fail the runner
            log.debug("watermark beat on %s: %s", subject, exc)
