"""Start a hot standby replica from its peer's checkpoint instead of its own stale one.

Replicas of a fragment run the same agreed batches (:mod:`spanflow.nats.batch_plan`),
so each query's checkpoint holds, batch for batch, what its peer's holds. A replica
that restarts far behind (its node died, it was placed again) would replay every batch
it missed one at a time — small batches, each paying Spark's fixed cost, no faster
than its peer makes new ones — and might never catch up. Instead each of its queries
takes a copy of the peer's query checkpoint, cut at the peer's last committed batch
``C``: the offsets and commit logs up to ``C`` and the state files (RocksDB changelogs
and snapshots are written before a batch commits, so all that ``C`` needs is there;
newer state files are the same batch's, which the replica computes identically). It
then runs batch ``C + 1`` from the agreed plan, as the peer does.

The peer keeps writing while it is copied: files Spark's maintenance deletes meanwhile
make a copy fail, and it is tried again.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pyspark.sql import SparkSession

from spanflow.spark.checkpoints import checkpoint_store as store
from spanflow.spec import locations

log = logging.getLogger(__name__)

BEHIND = 4
"""Committed batches a replica's own checkpoint may lag its peer's and still be used
(replaying a few costs less than copying the peer's state)."""

TRIES = 3

_LOG_ENTRY = re.compile(r"^\.?(\d+)(\.crc)?$")


def catch_up_from_peer(spark: SparkSession, own: str, peer: str) -> list[str]:
    """Replace each query checkpoint under ``own`` that lags its counterpart under
    ``peer`` by more than :data:`BEHIND` batches with a copy of the peer's, cut at its
    last commit; returns the queries so seeded (sink paths relative to ``own``)."""
    seeded = []
    for query in _query_dirs(spark, peer):
        theirs = _last_commit(spark, locations.join(peer, query))
        mine = _last_commit(spark, locations.join(own, query))
        if theirs is None or (mine is not None and theirs - mine <= BEHIND):
            continue
        if _copy_cut(spark, locations.join(peer, query), locations.join(own, query), theirs):
            log.info(
                "query %s: own checkpoint at batch %s, peer's at %d: starting from the peer's",
                query,
                mine,
                theirs,
            )
            seeded.append(query)
    return seeded


def _fs(spark: SparkSession, location: str) -> tuple[Any, Any]:
    return store.file_system(spark, location)


def _names(spark: SparkSession, location: str) -> list[tuple[str, bool]]:
    """(name, is a directory) of each entry of ``location`` (none when it is missing)."""
    path, fs = _fs(spark, location)
    if not fs.exists(path):
        return []
    return [(s.getPath().getName(), bool(s.isDirectory())) for s in fs.listStatus(path)]


def _query_dirs(spark: SparkSession, root: str, depth: int = 3) -> list[str]:
    """The query checkpoints under ``root`` (directories holding a ``commits`` log),
    relative to it."""
    names = _names(spark, root)
    if any(name == "commits" and is_dir for name, is_dir in names):
        return [""]
    if depth == 0:
        return []
    out: list[str] = []
    for name, is_dir in names:
        if is_dir and not name.startswith("."):
            below = _query_dirs(spark, locations.join(root, name), depth - 1)
            out.extend(locations.join(name, q) if q else name for q in below)
    return out


def _last_commit(spark: SparkSession, query: str) -> int | None:
    entries = [
        _LOG_ENTRY.match(name) for name, _ in _names(spark, locations.join(query, "commits"))
    ]
    batches = [int(m.group(1)) for m in entries if m and not m.group(2)]
    return max(batches, default=None)


def _copy_cut(spark: SparkSession, source: str, target: str, last: int) -> bool:
    """Copy ``source`` over ``target``, without log entries after batch ``last``. The
    copy is staged beside ``target`` first: a failed one leaves ``target`` as it was."""
    staging = target.rstrip("/") + ".peer"
    try:
        for attempt in range(1, TRIES + 1):
            try:
                if not store.copy(spark, source, staging):
                    return False
                for log_dir in ("offsets", "commits"):
                    _drop_after(spark, locations.join(staging, log_dir), last)
                break
            except Exception as exc:  # a file the peer's maintenance deleted meanwhile
                log.warning("copying %s (try %d of %d): %s", source, attempt, TRIES, exc)
        else:
            return False
        return store.copy(spark, staging, target)
    finally:
        store.remove(spark, staging)


def _drop_after(spark: SparkSession, log_dir: str, last: int) -> None:
    """Delete the log entries (and their checksums, temporary files) after ``last``."""
    for name, _ in _names(spark, log_dir):
        m = _LOG_ENTRY.match(name)
        if (m and int(m.group(1)) > last) or name.endswith(".tmp"):
            path, fs = _fs(spark, locations.join(log_dir, name))
            fs.delete(path, False)
