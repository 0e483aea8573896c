"""How each connector runs on Spark: a reader (a streaming DataFrame for a source step)
and a batch writer (what a sink does with each micro-batch), registered by connector
name. The connector itself — its options and guarantees — is declared in
:mod:`spanflow.spec.connectors`.

JetStream, Parquet and the console are wired by :mod:`spanflow.spark.compile.io` and
:mod:`spanflow.spark.runner` themselves (the planner and the real-time path know
them); every other connector registers here and nothing else names it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from spanflow.errors import CompileError
from spanflow.plugins import import_all
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.io import SinkStep, SourceStep


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


@dataclass(frozen=True)
class SinkContext:
    """What a batch writer gets besides its step. ``check_fence`` raises when this
    fragment no longer owns its output (call it before anything becomes visible)."""

    pipeline: str
    check_fence: Callable[[], None]
    nats_url: str = ""
    """Where the pipeline's dead letters go (a writer that gives up on a record)."""
    epoch: int | None = None
    """The fragment's epoch, carried by its dead letters (None: not fenced)."""


Reader = Callable[[SourceContext, SourceStep], DataFrame]
Check = Callable[[SourceStep | SinkStep, StructType | None], None]
"""Raises CompileError when the step's external system cannot be used as configured
(unreachable, a missing topic or table, refused credentials). A sink's check gets the
schema of the rows it will write (to create or check a table)."""
BatchWrite = Callable[[DataFrame, int], None]
"""``foreachBatch``'s function: (the micro-batch, its id)."""
WriterFactory = Callable[[SinkContext, str, Any], "BatchWriter"]
"""Makes a sink's writer from (context, sink id, the sink's typed options): a
:class:`BatchWriter` subclass registered with :func:`writes`."""


class BatchWriter:
    """A sink's writer for one query: ``write`` each micro-batch, ``close`` at the end."""

    def write(self, batch: DataFrame, batch_id: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (the query stopped)."""


F = TypeVar("F", bound=Callable[..., Any])
_READERS: dict[str, Reader] = {}
_WRITERS: dict[str, WriterFactory] = {}
_CHECKS: dict[str, Check] = {}


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
        *((s.kind, s) for s in spec.sinks() if sinks is None or s.id in sinks),
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
    return _registered(_WRITERS, sink.kind, sink, "writer")


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
