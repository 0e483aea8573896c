"""What a pipeline's connectors need around its queries, so the runner names none of
them: the streams and mirrors made before any query starts (:func:`provision`, one
function for the runner's role), the source a query reads through (a data source of
its own, or the JVM's for Real-Time Mode), and what a stopped real-time query leaves
behind.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from spanflow.nats.streams import SyncNats, ensure_source_streams, ensure_stream, stream_usage
from spanflow.protocol.metrics import StreamUsage
from spanflow.spark.checkpoints import checkpoint_store
from spanflow.spark.connectors.jetstream import realtime
from spanflow.spark.connectors.jetstream.source import register_isolated
from spanflow.spark.deadletter import DLQ_SUBJECT_PREFIX
from spanflow.spec import locations
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.retention import Retention
from spanflow.spec.steps.joins import EnrichStep

REALTIME_SOURCE_FORMAT = realtime.SOURCE_FORMAT
"""The source format a real-time query's plan reads through (the jar's JVM source)."""


@dataclass
class Provisioned:
    """What :func:`provision` made for one runner."""

    streams: list[str] = field(default_factory=list)
    """The streams the pipeline reads and writes (its dead letters' included)."""
    sourced: list[str] = field(default_factory=list)
    """Streams here that copy another site's (revived after a cut by the agent)."""
    mirrors: list[Any] = field(default_factory=list)
    """Threads copying postgres: lookup tables into their buckets."""
    dead_letter_stream: str = ""

    def usage(self, client: SyncNats | None, warn_at: float) -> list[StreamUsage]:
        """How full the streams are (the dead letters' too), against their limits."""
        if client is None:
            return []
        found = [
            client.run(lambda n=name: stream_usage(client.js, n, warn_at=warn_at))  # type: ignore[misc]
            for name in dict.fromkeys(self.streams)
        ]
        return [u for u in found if u is not None]

    def dead_letters(self, client: SyncNats | None, subject: str) -> int:
        """Messages in the dead-letter stream under ``subject`` (0 when unknown)."""
        if client is None or not self.dead_letter_stream:
            return 0
        stream = self.dead_letter_stream
        try:
            info = client.run(lambda: client.js.stream_info(stream, subjects_filter=subject))
        except Exception:
            return 0
        return sum((info.state.subjects or {}).values())

    def stop(self) -> None:
        for mirror in self.mirrors:
            with contextlib.suppress(Exception):
                mirror.stop()
        self.mirrors.clear()


def prepare_checkpoints(
    spark: SparkSession, where: str, nats_url: str, domain: str | None, retention: Retention
) -> None:
    """Point a ``jetstream://`` checkpoint location at this node's NATS (its site's
    domain), before anything reads the offset logs there; other locations need nothing."""
    if locations.scheme(where) == locations.JETSTREAM:
        checkpoint_store.configure(spark, nats_url, domain=domain, replicas=retention.replicas)


def provision(
    client: SyncNats,
    spec: PipelineSpec,
    *,
    nats_url: str,
    domain: str | None,
    retention: Retention,
) -> Provisioned:
    """Before any of ``spec``'s queries runs: its dead-letter stream, the streams its
    sources read (or copy from another site's domain), and a first copy of each
    postgres lookup table (so the first records find the table). Sink streams are made
    by their writers."""
    dead_letters = retention.model_copy(update={"max_age": spec.dead_letter_retention})
    client.run(
        lambda: ensure_stream(
            client.js, spec.dead_letter_stream, [f"{DLQ_SUBJECT_PREFIX}.>"], retention=dead_letters
        )
    )
    sources = client.run(lambda: ensure_source_streams(client.js, spec, domain, retention))
    out = Provisioned(
        streams=[spec.dead_letter_stream, *sources], dead_letter_stream=spec.dead_letter_stream
    )
    out.sourced = [
        s.stream
        for s in spec.sources()
        if s.stream and s.source_domain and s.source_domain != domain
    ]
    out.streams.extend(s.stream for s in spec.sinks() if s.stream)
    out.mirrors = _start_mirrors(spec, nats_url)
    return out


def _start_mirrors(spec: PipelineSpec, nats_url: str) -> list[Any]:
    from spanflow.spark.connectors.postgres import TableMirror

    tables = [s for s in spec.steps if isinstance(s, EnrichStep) and s.pg_table is not None]
    return [TableMirror(nats_url, step).start() for step in tables]


def isolated_source(spark: SparkSession, name: str) -> str:
    """The JetStream data source registered under ``name`` for one query alone (and
    anew on each restart: see :func:`register_isolated`); returns the format."""
    return register_isolated(spark, name)


def forget_realtime(spark: SparkSession, query_id: str) -> None:
    """Drop a stopped real-time query's live counters."""
    with contextlib.suppress(Exception):
        realtime.forget_live_read(spark, query_id)
