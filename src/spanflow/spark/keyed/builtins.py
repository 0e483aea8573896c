"""Built-in steps written as keyed processors: count windows, the incremental
``reduce`` of event-time windows and the alarm guard ``suppress``.

They run through the same adapter as users' processors (:mod:`.keyed_processor`),
so they get the same guarantees: state in RocksDB, checkpointed; each key's batch
all or nothing; a failing reduce function dead-letters that key's records and the
query goes on. Accumulators are plain data in JSON state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from spanflow.api.processor import Context, KeyedProcessor, Record, StateDeclarations
from spanflow.spark.keyed.state import EPOCH, to_micros
from spanflow.spec.aggregates import parse_aggregate
from spanflow.spec.steps.alarms import SUPPRESSED

Reduce = Callable[[Record, Record], Record]


class Accumulators:
    """count/sum/avg/min/max as mergeable plain-data accumulators (SQL semantics:
    nulls are skipped; an aggregate of no values is null, a count is 0)."""

    def __init__(self, aggregates: Mapping[str, str]) -> None:
        self.specs = [(name, *parse_aggregate(text)) for name, text in aggregates.items()]

    def empty(self) -> dict[str, Any]:
        return {
            name: ([0, 0] if fn == "avg" else (0 if fn == "count" else None))
            for name, fn, _ in self.specs
        }

    def add(self, acc: dict[str, Any], record: Mapping[str, Any]) -> None:
        for name, fn, field in self.specs:
            value = None if field is None else record.get(field)
            if fn == "count":
                acc[name] += 1 if field is None or value is not None else 0
            elif value is None:
                continue
            elif fn == "avg":
                acc[name] = [acc[name][0] + value, acc[name][1] + 1]
            elif acc[name] is None:
                acc[name] = value
            elif fn == "sum":
                acc[name] += value
            else:
                acc[name] = min(acc[name], value) if fn == "min" else max(acc[name], value)

    def merge(self, parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
        out = self.empty()
        for part in parts:
            for name, fn, _ in self.specs:
                mine, theirs = out[name], part[name]
                if fn == "count":
                    out[name] = mine + theirs
                elif fn == "avg":
                    out[name] = [mine[0] + theirs[0], mine[1] + theirs[1]]
                elif theirs is None:
                    continue
                elif mine is None:
                    out[name] = theirs
                elif fn == "sum":
                    out[name] = mine + theirs
                else:
                    out[name] = min(mine, theirs) if fn == "min" else max(mine, theirs)
        return out

    def result(self, acc: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, fn, _ in self.specs:
            if fn == "avg":
                total, n = acc[name]
                out[name] = total / n if n else None
            else:
                out[name] = acc[name]
        return out


def values_of(record: Mapping[str, Any], key_fields: tuple[str, ...]) -> Record:
    """A record without its key and metadata (``_``) fields: what a reduce folds."""
    return {k: v for k, v in record.items() if not k.startswith("_") and k not in key_fields}


class CountWindows(KeyedProcessor):
    """Windows of ``size`` records per key, a new one every ``slide`` records.

    As Flink's ``countWindow(size, slide)``: a window is emitted every ``slide``
    records with the last ``size`` records (fewer at the start of a key's stream).
    Records are kept as panes of gcd(size, slide) records, each an accumulator (or,
    for a reduce, its records), so memory is bounded by one window.
    """

    def __init__(
        self,
        *,
        size: int,
        slide: int | None = None,
        key_fields: tuple[str, ...] = (),
        aggregates: Mapping[str, str] | None = None,
        reduce: Reduce | None = None,
        event_time: str | None = None,
    ) -> None:
        self.size, self.slide = size, slide or size
        self.pane = math.gcd(self.size, self.slide)
        self.panes_per_window = self.size // self.pane
        self.key_fields = key_fields
        self.accumulators = Accumulators(aggregates) if aggregates else None
        self.reduce = reduce
        self.event_time = event_time

    def init(self, state: StateDeclarations) -> None:
        self.panes = state.list("panes")  # closed panes, oldest first (≤ one window)
        self.current = state.value("current")  # the filling pane
        self.seen = state.value("seen", "long")  # records so far
        self.index = state.value("index", "long")  # windows emitted so far

    def _new_pane(self) -> dict[str, Any]:
        body: Any = self.accumulators.empty() if self.accumulators else []
        return {"n": 0, "body": body, "first": None, "last": None}

    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        panes = None  # loaded on the first window of this batch
        current = self.current.get() or self._new_pane()
        seen = self.seen.get(0)
        for row in rows:
            self._add(current, row)
            seen += 1
            if current["n"] == self.pane:
                if panes is None:
                    panes = self.panes.get()
                panes = [*panes, current][-self.panes_per_window :]
                current = self._new_pane()
            if seen % self.slide == 0:
                assert panes is not None  # a slide is a whole number of panes
                yield self._window(panes)
        if panes is not None:
            self.panes.set(panes)
        self.current.set(current)
        self.seen.set(seen)

    def _add(self, pane: dict[str, Any], row: Record) -> None:
        pane["n"] += 1
        if self.accumulators:
            self.accumulators.add(pane["body"], row)
        else:
            pane["body"].append(values_of(row, self.key_fields))
        if self.event_time:
            ts = row.get(self.event_time)
            pane["first"] = ts if pane["first"] is None else pane["first"]
            pane["last"] = ts

    def _window(self, panes: list[dict[str, Any]]) -> Record:
        index = self.index.get(0)
        self.index.set(index + 1)
        out: Record = {"window_index": index}
        if self.event_time:
            out["window_start"] = panes[0]["first"]
            out["window_end"] = panes[-1]["last"]
        if self.accumulators:
            out.update(self.accumulators.result(self.accumulators.merge(p["body"] for p in panes)))
            return out
        assert self.reduce is not None
        records = [r for p in panes for r in p["body"]]
        acc = dict(records[0])
        for record in records[1:]:
            acc = self.reduce(acc, record)
        return {**acc, **out}


class TimeWindowReduce(KeyedProcessor):
    """Tumbling or sliding event-time windows folded with ``reduce`` as records arrive
    (one accumulator per open window, not the window's records).

    A window's result is emitted when the watermark passes its end (``emit="final"``),
    or after every batch that changed it (``"updates"``); either way its state is
    dropped then. Windows are aligned on the epoch, as Spark's ``window()``.
    """

    def __init__(
        self,
        *,
        size: float,
        slide: float | None,
        reduce: Reduce,
        event_time: str,
        key_fields: tuple[str, ...] = (),
        emit: str = "final",
    ) -> None:
        self.size_us = round(size * 1_000_000)
        self.slide_us = round((slide or size) * 1_000_000)
        self.reduce = reduce
        self.event_time = event_time
        self.key_fields = key_fields
        self.emit = emit

    def init(self, state: StateDeclarations) -> None:
        self.windows = state.map("windows", "long", "json")  # window start (µs) → accumulator

    def _starts(self, ts: datetime) -> list[int]:
        t = to_micros(ts)
        last = t - (t % self.slide_us)
        return [s for s in range(last, t - self.size_us, -self.slide_us) if s + self.size_us > t]

    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        changed: dict[int, Record] = {}
        for row in rows:
            ts = row.get(self.event_time)
            if ts is None:
                continue
            record = values_of(row, self.key_fields)
            for start in self._starts(ts):
                acc = changed.get(start) or self.windows.get(start)
                changed[start] = dict(record) if acc is None else self.reduce(acc, record)
        for start, acc in sorted(changed.items()):
            self.windows.put(start, acc)
            ctx.timers.register(_time_at(start + self.size_us))
            if self.emit == "updates":
                yield self._result(start, acc)

    def on_timer(self, key: Any, timer: datetime, ctx: Context) -> Iterator[Record]:
        start = to_micros(timer) - self.size_us
        acc = self.windows.get(start)
        self.windows.remove(start)
        if acc is not None and self.emit == "final":
            yield self._result(start, acc)

    def _result(self, start: int, acc: Record) -> Record:
        end = _time_at(start + self.size_us)
        out = {**acc, "window_start": _time_at(start), "window_end": end}
        if self.emit == "final":
            out["_window_time"] = end - timedelta(microseconds=1)
        return out


def _time_at(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


class RunningAggregate(KeyedProcessor):
    """Each record out again with ``output`` set to the aggregate so far (per key)."""

    def __init__(
        self, *, fn: str, field: str, output: str, key_fields: tuple[str, ...] = ()
    ) -> None:
        text = "count" if fn == "count" else f"{fn}({field})"
        self.accumulators = Accumulators({output: text})
        self.output = output
        self.key_fields = key_fields

    def init(self, state: StateDeclarations) -> None:
        self.acc = state.value("acc")

    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        acc = self.acc.get() or self.accumulators.empty()
        for row in rows:
            self.accumulators.add(acc, row)
            out = {k: v for k, v in row.items() if not k.startswith("_")}
            out.update(self.accumulators.result(acc))
            yield out
        self.acc.set(acc)


class TableLookup(KeyedProcessor):
    """A stream-table join keyed by the join value.

    Table changes and records come from two streams that Spark reads at their own
    pace, so a batch may hold table changes stored after records that come in a later
    batch. Each change is therefore kept as a version stamped with when it was stored;
    a record takes the newest version stored before it. Records of one stream arrive
    in store order, so versions older than the one the last record used are dropped.
    A record stored before every version still known (a bucket keeps only its last
    ``history`` changes per key) takes the oldest one: the table as far back as it
    can be seen.
    """

    MAX_VERSIONS = 1000
    """Versions kept per key at most (a table changing faster than records come)."""

    def __init__(self, *, fields: Mapping[str, str], inner: bool) -> None:
        self.fields = dict(fields)  # table field → output name
        self.inner = inner

    def init(self, state: StateDeclarations) -> None:
        self.versions = state.list("versions")  # [stored at (µs), row or None], oldest first

    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        versions = self.versions.get()
        changed = False
        used = -1  # index of the newest version a record used
        for row in rows:
            at = to_micros(row["_at"])
            if row["_table"]:
                entry = row["_entry"] or {}
                alive = any(v is not None for v in entry.values())
                versions.append([at, entry if alive else None])
                versions.sort(key=lambda v: v[0])
                changed = True
                continue
            index = self._version_at(versions, at)
            used = max(used, index)
            current = versions[index][1] if index >= 0 else None
            if current is None and self.inner:
                continue
            event = {k: v for k, v in (row["_event"] or {}).items() if not k.startswith("_")}
            looked_up = current or {}
            event.update({out: looked_up.get(f) for f, out in self.fields.items()})
            yield event
        if used > 0:
            versions, changed = versions[used:], True
        if len(versions) > self.MAX_VERSIONS:
            versions, changed = versions[-self.MAX_VERSIONS :], True
        if changed:
            self.versions.set(versions)

    @staticmethod
    def _version_at(versions: list[list[Any]], at: int) -> int:
        """The index of the newest version stored no later than ``at`` (else the oldest;
        -1 when there is none)."""
        for i in range(len(versions) - 1, -1, -1):
            if versions[i][0] <= at:
                return i
        return 0 if versions else -1


class Suppression(KeyedProcessor):
    """The ``suppress`` step (:mod:`spanflow.spec.steps.alarms`): a key's first record
    passes, the ones that follow are held back for ``once_per`` seconds — since the
    last one passed (``until="period"``) or since the key's last record of any kind
    (``until="quiet"``). A passed record counts the held-back ones in ``suppressed``."""

    def __init__(
        self,
        *,
        once_per: float,
        until: str,
        event_time: str | None,
        hidden: tuple[str, ...] = (),
    ) -> None:
        self.once_per = once_per
        self.quiet = until == "quiet"
        self.event_time = event_time
        self.hidden = frozenset(hidden)

    def init(self, state: StateDeclarations) -> None:
        # {"passed": seconds, "seen": seconds, "held": n}; an entry untouched for far
        # longer than once_per decides nothing (the next record passes either way)
        self.state = state.value("suppress", "json", ttl=max(4 * self.once_per, 3600.0))

    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        s: dict[str, Any] = self.state.get() or {"passed": None, "seen": None, "held": 0}
        now = ctx.processing_time.timestamp()
        out = []
        for row in rows:
            at = self._seconds(row, now)
            since = s["seen"] if self.quiet else s["passed"]
            if since is None or at - since >= self.once_per:
                record = {k: v for k, v in row.items() if k not in self.hidden}
                record[SUPPRESSED] = s["held"]
                out.append(record)
                s["passed"], s["held"] = at, 0
            else:
                s["held"] += 1
            s["seen"] = at if s["seen"] is None else max(s["seen"], at)
        self.state.set(s)
        yield from out

    def _seconds(self, row: Record, now: float) -> float:
        """The record's event time in seconds (processing time when it has none)."""
        stamp = row.get(self.event_time) if self.event_time else None
        return stamp.timestamp() if isinstance(stamp, datetime) else now
