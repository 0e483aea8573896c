"""How each connector runs on Spark: a reader (a streaming DataFrame for a source step)
and a writer (what a sink does with its query's output), registered by connector name;
JetStream's (:mod:`.jetstream`) as every other's. The connector itself — its options
and guarantees — is declared in :mod:`spanflow.spec.connectors`. The runner and the
compiler name no connector: they look them up here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamReader, DataStreamWriter, StreamingQuery
from pyspark.sql.types import StructType

from spanflow.errors import CompileError
from spanflow.plugins import import_all
from spanflow.protocol.metrics import LATENCY_BUCKETS, Histogram
from spanflow.spec.lateness import LateRule
from spanflow.spec.retention import DEFAULT_RETENTION, Retention

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from spanflow.nats.fences import Fence
    from spanflow.nats.streams import SyncNats
    from spanflow.spec.pipeline import PipelineSpec
    from spanflow.spec.steps.io import SinkStep, SourceStep

RowsCallback = Callable[[str, int, list[dict[str, Any]]], None]
"""(sink id, batch id, rows): where a console sink's rows go."""


@dataclass(frozen=True)
class SourceContext:
    """What a reader gets besides its step: the session, where dead letters go, and a
    name unique to this query (data sources are registered per query)."""

    spark: SparkSession
    nats_url: str
    pipeline: str
    query_token: str
    ddl: str
    schema: dict[str, str]
    data_source: str = ""
    """The JetStream data source registered for this query (spanflow's own streams)."""
    slot: tuple[int, int] = (0, 0)
    """(phase, interval) in ms: when this query's batches start (spark/query/stagger.py)."""
    batch_plan: str | None = None
    """Where this query's batch ends are agreed with its replicas (hot standby; see
    :mod:`spanflow.nats.batch_plan`), None when it plans alone."""
    checkpoint: str | None = None
    """The query's checkpoint location (where the batch before's watermark is)."""
    late_rules: tuple[LateRule, ...] = ()
    """The windows this source's records reach, when a record late for all of them is
    dead-lettered (:mod:`spanflow.spec.lateness`); empty: Spark drops late records."""
    source_name: str | None = None
    """The name the query's checkpoint keeps this source's offsets under
    (:mod:`spanflow.spark.checkpoints.source_names`); None: by position, as before."""
    passive: bool = False
    """A reader that only looks (``spanflow detector fit`` reading history): it moves no
    consumer or group the pipeline's own query reports its progress by, and sends no
    dead letters (the pipeline's query sent those of the same records)."""

    def reader(self) -> DataStreamReader:
        """``spark.readStream``, named as the checkpoint keeps this source."""
        reader = self.spark.readStream
        return reader.name(self.source_name) if self.source_name else reader


@dataclass
class Output:
    """What one sink wrote in this process: records (a replayed batch counts again,
    though JetStream keeps its records once) and their end-to-end latency."""

    records: int = 0
    latency: Histogram = field(default_factory=Histogram)

    def count(self, records: int, born: np.ndarray, now: float) -> None:
        """``records`` were written at ``now`` (Unix time); ``born``: when the source
        stored each record that still carries it (``_published``, Unix seconds), which
        times the way through the pipeline."""
        self.records += records
        if born.size:
            seconds = np.maximum(0.0, now - born)
            buckets = np.searchsorted(np.asarray(LATENCY_BUCKETS), seconds, side="left")
            counts = np.bincount(buckets, minlength=len(LATENCY_BUCKETS) + 1)
            self.latency.merge([int(n) for n in counts], float(seconds.sum()))


@dataclass(frozen=True)
class SinkContext:
    """What a writer gets besides its step's options, from the runner of its query.
    ``check_fence`` raises when this fragment no longer owns its output (call it before
    anything becomes visible)."""

    pipeline: str
    check_fence: Callable[[], None]
    step: SinkStep
    spark: SparkSession
    nats_url: str = ""
    """Where the pipeline's dead letters go (a writer that gives up on a record)."""
    fence: Fence | None = None
    """The fragment's fence (None: not fenced, as in ``spanflow run``)."""
    fences: Callable[[], KeyValue] | None = None
    """The fences bucket (with a fence)."""
    nats: SyncNats | None = None
    """The runner's own NATS connection."""
    checkpoint: str = ""
    """Where the query checkpoints."""
    first_start: bool = True
    """The query's first start in this process (a restart reuses what it checked)."""
    retention: Retention = DEFAULT_RETENTION
    """Limits of the streams the runner creates (the site's)."""
    output: Output = field(default_factory=Output)
    """Where the writer counts what it wrote."""
    show_rows: RowsCallback | None = None
    show_limit: int = 50
    """Console sinks: where rows go, and at most how many a batch."""
    replicated: bool = False
    """Hot standby: a peer replica writes the same agreed batches to the same sink."""

    @property
    def epoch(self) -> int | None:
        """The fragment's epoch, carried by its dead letters (None: not fenced)."""
        return self.fence.epoch if self.fence is not None else None


Reader = Callable[[SourceContext, "SourceStep"], DataFrame]
Check = Callable[["SourceStep | SinkStep", StructType | None], None]
"""Raises CompileError when the step's external system cannot be used as configured
(unreachable, a missing topic or table, refused credentials). A sink's check gets the
schema of the rows it will write (to create or check a table)."""
BatchWrite = Callable[[DataFrame, int], None]
"""``foreachBatch``'s function: (the micro-batch, its id)."""
WriterFactory = Callable[[SinkContext, str, Any], "BatchWriter"]
"""Makes a sink's writer from (context, sink id, the sink's typed options): a
:class:`BatchWriter` subclass registered with :func:`writes`."""


RealtimeStart = Callable[[SinkContext, DataFrame, str], StreamingQuery]
"""Starts a sink's query in Spark's Real-Time Mode: (context, output, query name)."""


class BatchWriter:
    """A sink's writer for one query: ``write`` each micro-batch, ``close`` at the end."""

    streams: tuple[str, ...] = ()
    """JetStream streams it writes (the runner reports how full they are)."""

    def attach(self, writer: DataStreamWriter) -> DataStreamWriter:
        """Make the query write through this sink: by default, ``write`` each batch."""
        return writer.foreachBatch(self.write)

    def write(self, batch: DataFrame, batch_id: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (the query stopped)."""


F = TypeVar("F", bound=Callable[..., Any])
_READERS: dict[str, Reader] = {}
_WRITERS: dict[str, WriterFactory] = {}
_CHECKS: dict[str, Check] = {}
_REALTIME: dict[str, RealtimeStart] = {}


def content_ids(prefix: str, payloads: list[bytes]) -> list[str]:
    """``<prefix>:<content hash>:<occurrence>`` per payload: the same for the same
    records whenever a batch is replayed, whatever their order (idempotency keys,
    document ids, dead-letter ids).

    >>> content_ids("p:s:3", [b"{}", b"{}"])[1].endswith(":1")
    True
    """
    seen: dict[bytes, int] = {}
    out = []
    for payload in payloads:
        digest = hashlib.blake2b(payload, digest_size=12).digest()
        n = seen.get(digest, 0)
        seen[digest] = n + 1
        out.append(f"{prefix}:{digest.hex()}:{n}")
    return out


def _registrar(table: dict[str, F]) -> Callable[[str], Callable[[F], F]]:
    """A decorator factory that registers a function in ``table`` by connector name."""

    def by_name(name: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            table[name] = fn
            return fn

        return register

    return by_name


reads = _registrar(_READERS)
writes = _registrar(_WRITERS)
checks = _registrar(_CHECKS)
starts_realtime = _registrar(_REALTIME)


def preflight(
    spec: PipelineSpec,
    schemas: Mapping[str, StructType] | None = None,
    *,
    sinks: Collection[str] | None = None,
    sources: bool = True,
) -> None:
    """Check every source and sink of an external system before a query starts, so a
    wrong address, topic or credential is one clear error, not a restart loop.
    ``schemas``: each sink's row schema, by sink id; ``sinks``: only these sinks (None:
    all); ``sources``: the sources too."""
    _import_connectors()
    steps: list[tuple[str, SourceStep | SinkStep]] = [
        *((s.connector, s) for s in (spec.sources() if sources else [])),
        *((s.connector, s) for s in spec.sinks() if sinks is None or s.id in sinks),
    ]
    for name, step in steps:
        _check_library(step)
        check = _CHECKS.get(name)
        if check is not None:
            check(step, (schemas or {}).get(step.id))


def _import_connectors() -> None:
    import_all(__name__, __path__)


def reader(step: SourceStep) -> Reader:
    return _registered(_READERS, step.connector, step, "reader")


def writer(sink: SinkStep) -> WriterFactory:
    return _registered(_WRITERS, sink.connector, sink, "writer")


def realtime_start(sink: SinkStep) -> RealtimeStart:
    return _registered(_REALTIME, sink.connector, sink, "Real-Time Mode writer")


def _registered(table: dict[str, Any], name: str, step: SourceStep | SinkStep, what: str) -> Any:
    _import_connectors()
    _check_library(step)
    found = table.get(name)
    if found is None:
        raise CompileError(step.id, f"no Spark {what} for {name!r}")
    return found


def _check_library(step: Any) -> None:
    problem = step.connector_info.missing_library()
    if problem is not None:
        raise CompileError(step.id, problem)
