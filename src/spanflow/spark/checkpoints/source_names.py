"""Sources tracked by name in a query's checkpoint, so a query can gain or lose sources
and keep its state (Spark's streaming source evolution, Spark 4.2+).

Spark keeps one offset per source of a query. In its first offset-log format (``v1``)
the offsets are a list in the order the sources have in the plan, so a query that reads
one more source — a global fragment when a third site joins — cannot resume. With
``spark.sql.streaming.queryEvolution.enableSourceEvolution`` and every source named
(``readStream.name(...)``), the log is ``v2``: offsets keyed by name. A source added
starts at its own initial offset, a source removed is forgotten, and each stateful
operator's state is restored as before (tried on Spark 4.3 with Python data sources:
docs/semantics.md#sources-added-to-a-running-query).

A checkpoint written in ``v1`` cannot switch (Spark refuses to enable source evolution
on it): its queries keep running unnamed, as they were, until the pipeline starts anew.

The setting is the session's, and Spark reads it when it analyses a query's plan and
when the query starts; a process runs many queries in one session, so each query's
compile and start set it under one lock (:func:`evolution`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Iterator

from pyspark.sql import SparkSession

from spanflow.spark.checkpoints import checkpoint_store
from spanflow.spec import locations

EVOLUTION_CONF = "spark.sql.streaming.queryEvolution.enableSourceEvolution"
NAMED_LOG = "v2"
"""The first line of an offset-log entry that keys offsets by source name."""

_ENTRY = re.compile(r"^\d+$")
_lock = threading.RLock()


def source_name(step_id: str) -> str:
    """The name a source step's offsets are kept under: Spark allows ASCII letters,
    digits and ``_`` only, so other characters become ``_`` and a short hash of the id
    keeps two ids apart (``from-a`` and ``from_a``).

    >>> source_name("readings"), source_name("w__from_edge-a")
    ('readings', 'w__from_edge_a_cc57c5')
    """
    clean = re.sub(r"[^A-Za-z0-9_]", "_", step_id)
    if clean == step_id:
        return clean
    return f"{clean}_{hashlib.sha1(step_id.encode()).hexdigest()[:6]}"


def offset_log_version(spark: SparkSession, checkpoint: str) -> str | None:
    """``v1`` or ``v2`` for the newest entry of a query's offset log; None when the
    query never planned a batch (a new query: it may name its sources)."""
    offsets = locations.join(checkpoint, "offsets")
    entries = [n for n in checkpoint_store.names(spark, offsets) if _ENTRY.match(n)]
    if not entries:
        return None
    newest = max(entries, key=int)
    text = checkpoint_store.read_text(spark, locations.join(offsets, newest)) or ""
    return text.split("\n", 1)[0].strip() or None


def names_sources(spark: SparkSession, checkpoint: str) -> bool:
    """Whether the query on ``checkpoint`` names its sources: a new query, or one whose
    offsets are already kept by name."""
    return offset_log_version(spark, checkpoint) in (None, NAMED_LOG)


@contextlib.contextmanager
def evolution(spark: SparkSession, *, enabled: bool) -> Iterator[None]:
    """The session's source-evolution setting as one query needs it (its plan analysed,
    its start) while no other query of this process changes it."""
    with _lock:
        conf = spark.conf
        before = conf.get(EVOLUTION_CONF, "false") or "false"
        conf.set(EVOLUTION_CONF, "true" if enabled else "false")
        try:
            yield
        finally:
            conf.set(EVOLUTION_CONF, before)
