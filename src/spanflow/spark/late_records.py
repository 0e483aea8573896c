"""Late records, seen where they are read: a source's share of dead-lettering them.

Spark drops a record from a window aggregation when the windows it belongs to were
written in an earlier micro-batch: their end is at or before the watermark of the
batch before the current one (Spark's watermark "for late events"; the batch's own
watermark only decides which windows it writes). That watermark is in the query's
checkpoint: ``offsets/<N-1>`` records ``batchWatermarkMs`` for batch N-1, and Spark
writes ``offsets/<N>`` before it plans batch N's partitions. A source that reads it
when it plans (:func:`late_watermark_us`) and knows the windows its records reach
(:mod:`spanflow.spec.lateness`) finds, at read time, exactly the records Spark would
drop, and sends them to the dead letters (:func:`late_rows`) — on a replay the same
ones, as the offset log does not change.

Only local checkpoints are read here: a checkpoint in ``jetstream://`` or another
Hadoop store leaves late records to Spark (dropped, counted in its progress).
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from spanflow.spec import locations
from spanflow.spec.lateness import LateRule

log = logging.getLogger(__name__)

_ENTRY = re.compile(r"^(\d+)$")


def late_watermark_us(checkpoint: str) -> int | None:
    """The watermark (µs) Spark drops late records by in the batch being planned: the
    one batch N-1 ran with, N the newest entry of the offset log. None: no batch before
    (nothing written yet), a store this process cannot read, or an unreadable log."""
    if locations.scheme(checkpoint) not in (None, "file"):
        return None
    offsets = Path(checkpoint.removeprefix("file://")) / "offsets"
    try:
        batches = sorted(int(p.name) for p in offsets.iterdir() if _ENTRY.match(p.name))
    except OSError:
        return None
    if len(batches) < 2:
        return None
    try:
        lines = (offsets / str(batches[-2])).read_text().splitlines()
        millis = orjson.loads(lines[1])["batchWatermarkMs"]
    except (OSError, IndexError, KeyError, ValueError) as exc:
        log.warning("cannot read the watermark in %s: %s", offsets, exc)
        return None
    return int(millis) * 1000


def late_reason(rules: tuple[LateRule, ...], watermark_us: int) -> str:
    """What a late record's reason says after its event time."""
    mark = datetime.fromtimestamp(watermark_us / 1e6, UTC).isoformat()
    windows = ", ".join(r.window for r in rules)
    return f"is at or before the watermark {mark}; {windows} wrote its windows already"


def late_rows(
    batch: pa.RecordBatch, field: str, rules: tuple[LateRule, ...], watermark_us: int
) -> np.ndarray:
    """The indices of ``batch``'s rows late for every window in ``rules``: each window
    holding the row ends at or before ``watermark_us``. Rows without event time, and
    heartbeat rows, are never late."""
    if not rules or batch.num_rows == 0:
        return np.empty(0, dtype=np.int64)
    column = batch.column(field).cast(pa.timestamp("us"))
    valid = ~np.asarray(column.is_null(), dtype=bool)
    micros = np.asarray(column.cast(pa.int64()).fill_null(0), dtype=np.int64)
    late = valid.copy()
    for rule in rules:
        late &= _last_end_us(rule, micros) <= watermark_us
    if "_heartbeat" in batch.schema.names:
        beats = batch.column("_heartbeat").fill_null(False)
        late &= ~np.asarray(beats, dtype=bool)
    return np.flatnonzero(late)


def _last_end_us(rule: LateRule, micros: np.ndarray) -> np.ndarray:
    """:meth:`LateRule.last_end_us` over a column (numpy's % floors as Python's does)."""
    if rule.kind == "session":
        return micros + round(rule.gap * 1_000_000)
    slide = round((rule.slide or rule.size) * 1_000_000)
    return micros - micros % slide + round(rule.size * 1_000_000)
