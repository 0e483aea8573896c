"""Run a :class:`spanflow.KeyedProcessor` as Spark's ``StatefulProcessor``.

Runs in Spark's Python workers. Spark groups a micro-batch's records by bucket (a
hash of the key, see :func:`spanflow.spark.compile.process.bucketed`) and calls
``handleInputRows`` per bucket; here that becomes one all-or-nothing call of the
user's ``process`` per key (:mod:`spanflow.spark.keyed.state`): records as dicts in
event-time (or arrival) order, output checked against the declared schema, and on an exception the
state left as it was and the key's records dead-lettered with the reason. Timers
fire through ``handleExpiredTimer`` the same way. Dead letters are published when
Spark closes the processor at the end of the task, with ids derived from the batch
and the record, so a replayed batch does not dead-letter twice.

The adapter is pickled by Spark with everything it holds: the settings are plain
data plus the processor class (imported by reference where it is importable).
"""

from __future__ import annotations

import hashlib
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
import pandas as pd
from pyspark import TaskContext
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from spanflow.api.processor import KeyedProcessor
from spanflow.spark.deadletter import DeadLetter, send_dead_letters
from spanflow.spark.keyed.state import (
    BufferedMap,
    BufferedTimers,
    Declarations,
    StateError,
    Transaction,
    from_millis,
    pack,
    to_millis,
    unpack,
    value_check,
)

Clock = str  # "event_time" | "processing_time" | "none"

STORE = "spanflow_keys"
"""The map state (packed key → packed slots) that holds every key's state of a bucket."""
TIMER_INDEX = "spanflow_timer_index"
"""The map state (time in ms → packed keys) of a bucket's timers."""


def pack_key(key: Any) -> bytes:
    """A key as the stored form of its state's name in the bucket's map state (a
    composite key as an array of its values)."""
    return pack(key)


def _unpacked_key(packed: bytes) -> Any:
    value = unpack(packed)
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class OutputField:
    name: str
    kind: str
    optional: bool


@dataclass(frozen=True)
class ProcessorSettings:
    """Everything the adapter needs on a worker (pickled with it)."""

    factory: Callable[[], KeyedProcessor]
    key_fields: tuple[str, ...]
    output: tuple[OutputField, ...]
    clock: Clock
    order_by: tuple[str, ...] = ()
    pipeline: str = ""
    step: str = ""
    nats_url: str = ""
    dead_letters: bool = True
    """Publish the records of failed calls (off in tests without a broker)."""
    input_names: tuple[str, ...] = ()
    """The input's column names, in order (Spark passes them positionally renamed)."""
    input_micros: tuple[int, ...] = ()
    """Positions of the input's timestamp columns, which Spark passes as microseconds
    since the epoch (``compile/process.py``): the adapter makes them UTC datetimes."""
    native_ttl: bool | None = None
    """Let Spark expire state (default: in processing-time processors, where Spark
    allows it); else entries carry their expiry and are dropped when read."""
    late_field: str | None = None
    """Event-time column whose records at or behind the watermark are dead-lettered as
    late before the processor sees them (the input's watermark is stripped from the
    column, so Spark does not drop them silently)."""


class _Call:
    """The context of one call (:class:`spanflow.api.processor.Context`)."""

    def __init__(self, key: Any, watermark_ms: int, now_ms: int, timers: BufferedTimers):
        self._key = key
        self._watermark = from_millis(watermark_ms) if watermark_ms > 0 else None
        self._now = from_millis(now_ms)
        self._timers = timers
        self.rejected: list[tuple[dict[str, Any], str]] = []

    @property
    def key(self) -> Any:
        return self._key

    @property
    def watermark(self) -> datetime | None:
        return self._watermark

    @property
    def processing_time(self) -> datetime:
        return self._now

    @property
    def timers(self) -> BufferedTimers:
        return self._timers

    def reject(self, record: dict[str, Any], reason: str) -> None:
        self.rejected.append((record, reason))


@dataclass
class _Failures:
    letters: list[DeadLetter] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)

    def add(self, settings: ProcessorSettings, payload: bytes, reason: str, seq: int) -> None:
        ctx = TaskContext.get()
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        digest = hashlib.blake2b(payload, digest_size=12).hexdigest()
        n = self.seen.get(digest, 0)
        self.seen[digest] = n + 1
        msg_id = f"{settings.pipeline}:{settings.step}:{batch or 0}:{digest}:{n}"
        self.letters.append(DeadLetter(msg_id=msg_id, data=payload, reason=reason, seq=seq))


def _json(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z)


class KeyStore:
    """Spark's side of a bucket's state: every key's packed slots in one map state
    (key → slots), and the bucket's timer index (time → keys with a timer then).

    Spark's timers belong to the grouping key, which is the bucket: one Spark timer
    per distinct time serves every key of the bucket with a timer then."""

    def __init__(self, handle: StatefulProcessorHandle, clock: Clock, ttl_ms: int | None):
        self._handle = handle
        self._values = handle.getMapState(STORE, "k binary", "v binary", ttl_ms)
        self._index = (
            handle.getMapState(TIMER_INDEX, "at bigint", "keys binary") if clock != "none" else None
        )
        self._pending: dict[int, tuple[set[bytes], set[bytes]]] = {}
        """Timer changes of the current bucket call: time → (keys added, keys removed)."""

    def load(self, packed_key: bytes) -> dict[str, Any]:
        row = self._values.getValue((packed_key,))  # one round trip; None: no state
        return unpack(row[0]) if row is not None else {}

    def write(self, packed_key: bytes, slots: bytes | None) -> None:
        if slots is None:
            self._values.removeKey((packed_key,))
        else:
            self._values.updateValue((packed_key,), (slots,))

    def add_timer(self, packed_key: bytes, ms: int) -> None:
        added, removed = self._pending.setdefault(ms, (set(), set()))
        added.add(packed_key)
        removed.discard(packed_key)

    def remove_timer(self, packed_key: bytes, ms: int) -> None:
        added, removed = self._pending.setdefault(ms, (set(), set()))
        removed.add(packed_key)
        added.discard(packed_key)

    def flush_timers(self) -> None:
        """Apply the bucket call's timer changes to the index: one read and one write
        per distinct time, however many keys share it (window ends often do)."""
        if self._index is None or not self._pending:
            self._pending.clear()
            return
        for ms, (added, removed) in sorted(self._pending.items()):
            row = self._index.getValue((ms,))
            keys: list[bytes] = unpack(row[0]) if row is not None else []
            kept = [k for k in keys if k not in removed]
            new = kept + sorted(k for k in added if k not in kept)
            if new == keys:
                continue
            if new:
                self._index.updateValue((ms,), (pack(new),))
                if row is None:
                    self._handle.registerTimer(ms)
            else:
                self._index.removeKey((ms,))
                self._handle.deleteTimer(ms)
        self._pending.clear()

    def take_due(self, ms: int) -> list[bytes]:
        """The keys whose timer at ``ms`` fires now (Spark deletes its own timer)."""
        if self._index is None:
            return []
        self.flush_timers()
        row = self._index.getValue((ms,))
        if row is None:
            return []
        self._index.removeKey((ms,))
        keys: list[bytes] = unpack(row[0])
        return keys


class ProcessorAdapter(StatefulProcessor):
    """Spark's side of a keyed processor step.

    Spark groups the records by *bucket* (a hash of the key, one of 8:
    :data:`spanflow.spark.compile.process.BUCKET_IDS`)
    rather than by key: each call takes a bucket's records for the batch, splits them
    by key and calls the user's processor once per key. Spark's per-group work (a
    round trip to set the group, a pandas frame in, one out) is then paid per bucket,
    not per key, and each key costs one round trip to read its state and one to write
    it (docs/benchmarks.md)."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings

    # -- Spark's hooks --------------------------------------------------------------
    def init(self, handle: StatefulProcessorHandle) -> None:
        s = self.settings
        self._txn = Transaction()
        self._timers = BufferedTimers(self._txn, s.clock)
        self._failures = _Failures()
        self._checks = tuple((f, value_check(f.kind)) for f in s.output)
        self._fields = tuple((f.name, f.optional, check) for f, check in self._checks)
        self._declared = frozenset(f.name for f in s.output)
        self._user = s.factory()
        self._declarations = Declarations(self._txn)
        self._user.init(self._declarations)
        native = s.clock == "processing_time" if s.native_ttl is None else s.native_ttl
        ttl = self._declarations.longest_ttl() if native else None
        self._store = KeyStore(handle, s.clock, ttl)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        records = frames_to_records(rows, self.settings.input_names, self.settings.input_micros)
        if self.settings.late_field is not None:
            records = self._without_late(records, timerValues.getCurrentWatermarkInMs())
        out: list[dict[str, Any]] = []
        order_by = self.settings.order_by
        for value, group in self._by_key(records).items():
            ordered = in_order(group, order_by) if order_by else group
            out.extend(self._process_key(value, ordered, timerValues))
        self._store.flush_timers()
        return self._frames(out)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        ms = expiredTimerInfo.getExpiryTimeInMs()
        out: list[dict[str, Any]] = []
        for packed in self._store.take_due(ms):
            out.extend(self._fire(_unpacked_key(packed), packed, ms, timerValues))
        self._store.flush_timers()
        return self._frames(out)

    def close(self) -> None:
        try:
            self._user.close()
        finally:
            letters = self.take_dead_letters()
            if letters and self.settings.dead_letters:
                s = self.settings
                send_dead_letters(s.nats_url, s.pipeline, s.step, letters)

    # -- one key ----------------------------------------------------------------------
    def _process_key(
        self, key: Any, records: list[dict[str, Any]], tv: TimerValues
    ) -> list[dict[str, Any]]:
        packed = pack_key(key)
        call = self._begin(key, packed, tv, records)
        try:
            out = self._rows(self._user.process(key, records, call), key)
            slots = self._prepared()
        except Exception as exc:
            self._txn.rollback()
            self._dead_letter_records(records, exc)
            return []
        self._write(packed, slots)
        self._dead_letter_rejected(call)
        return out

    def _fire(self, key: Any, packed: bytes, ms: int, tv: TimerValues) -> list[dict[str, Any]]:
        call = self._begin(key, packed, tv, [])
        self._timers.fired(ms)
        when = from_millis(ms)
        try:
            out = self._rows(self._user.on_timer(key, when, call), key)
            slots = self._prepared()
        except Exception as exc:
            self._txn.rollback()
            payload = _json({"key": key, "timer": when.isoformat()})
            self._failures.add(self.settings, payload, _reason(exc, "on_timer"), 0)
            self._begin(key, packed, tv, [])  # the timer is gone either way
            self._timers.fired(ms)
            self._write(packed, self._prepared())
            return []
        self._write(packed, slots)
        self._dead_letter_rejected(call)
        return out

    def _prepared(self) -> bytes | bool | None:
        """The call's changes folded in: the key's packed slots to store, None to
        remove them, False when nothing changed (packing may raise: the call fails)."""
        if not self._txn.commit():
            return False
        slots = self._txn.slots
        return pack(slots) if slots else None

    def _write(self, packed: bytes, slots: bytes | bool | None) -> None:
        if slots is not False:
            self._store.write(packed, slots if isinstance(slots, bytes) else None)
        if self.settings.clock == "none":
            return
        for ms in self._timers.removed:
            self._store.remove_timer(packed, ms)
        for ms in self._timers.registered:
            self._store.add_timer(packed, ms)
        self._timers.registered, self._timers.removed = [], []

    # -- for spanflow.testing -----------------------------------------------------------
    def take_dead_letters(self) -> list[DeadLetter]:
        """The dead letters of failed calls since the last take."""
        letters, self._failures = self._failures.letters, _Failures()
        return letters

    def peek(self, name: str, key: Any, now_ms: int) -> Any:
        """A declared state's value for ``key`` (in the handle's current bucket), as the
        processor sees it (a list for a list state, a dict for a map state)."""
        state = self._declarations.declared.get(name)
        if state is None:
            raise KeyError(
                f"no state named {name!r} (declared: {sorted(self._declarations.declared)})"
            )
        packed = pack_key(key)
        self._txn.begin(now_ms, lambda: self._store.load(packed))
        try:
            if isinstance(state, BufferedMap):
                return dict(state.items())
            return state.get()
        finally:
            self._txn.rollback()

    # -- helpers ----------------------------------------------------------------------
    def _by_key(self, records: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
        """The records of each key, keys in order of first appearance."""
        groups: dict[Any, list[dict[str, Any]]] = {}
        fields = self.settings.key_fields
        if len(fields) == 1:
            name = fields[0]
            for record in records:
                value = record[name]
                group = groups.get(value)
                if group is None:
                    groups[value] = [record]
                else:
                    group.append(record)
            return groups
        for record in records:
            groups.setdefault(tuple(record[f] for f in fields), []).append(record)
        return groups

    def _begin(
        self, key: Any, packed: bytes, tv: TimerValues, records: list[dict[str, Any]]
    ) -> _Call:
        watermark = tv.getCurrentWatermarkInMs()
        now = tv.getCurrentProcessingTimeInMs()
        now = now if now > 0 else round(time.time() * 1000)
        self._txn.begin(now, lambda: self._store.load(packed))
        if self.settings.clock == "processing_time":
            self._timers.base_ms = now
        else:
            self._timers.base_ms = watermark if watermark > 0 else self._latest(records)
        return _Call(key, watermark, now, self._timers)

    def _latest(self, records: list[dict[str, Any]]) -> int | None:
        if not self.settings.order_by or not records:
            return None
        last = records[-1].get(self.settings.order_by[0])
        if isinstance(last, datetime | int | float) and not isinstance(last, bool):
            return to_millis(last)
        return None

    def _frames(self, rows: list[dict[str, Any]]) -> Iterator[pd.DataFrame]:
        if not rows:
            return iter(())
        return iter((records_to_frame(rows, self.settings.output),))

    def _rows(self, produced: Iterable[dict[str, Any]] | None, key: Any) -> list[dict[str, Any]]:
        """The call's output rows checked against the declared schema (raises on a
        mismatch), in schema order."""
        out: list[dict[str, Any]] = []
        fields = self.settings.key_fields
        keys = dict(zip(fields, key if len(fields) > 1 else (key,), strict=False))
        allowed = self._declared.union(keys)
        for item in produced or ():
            if not isinstance(item, dict):
                raise StateError(f"an output row must be a dict, got {type(item).__name__}")
            if not allowed.issuperset(item):  # one set operation per row, in C
                extra = [k for k in item if k not in allowed]
                names = [f.name for f, _ in self._checks]
                raise StateError(f"output fields {extra} are not in output_schema {names}")
            values: dict[str, Any] = {}
            for name, optional, check in self._fields:
                value = item.get(name)
                if value is None:
                    value = keys.get(name)  # a key field may be left out
                if value is None:
                    if not optional and name not in item:
                        raise StateError(f"output row has no field {name!r}")
                    values[name] = None
                    continue
                try:  # free in Python 3.11 unless it raises
                    values[name] = check(value)
                except StateError as exc:
                    raise StateError(f"output field {name!r}: {exc}") from None
            out.append(values)
        return out

    def _dead_letter_rejected(self, call: _Call) -> None:
        for record, reason in call.rejected:
            seq = record.get("_seq")
            self._failures.add(
                self.settings, _json(record), reason, int(seq) if isinstance(seq, int) else 0
            )

    def _without_late(
        self, records: list[dict[str, Any]], watermark_ms: int
    ) -> list[dict[str, Any]]:
        """The records after the watermark; the others dead-lettered as late (what
        Spark would have dropped without a word)."""
        field_ = self.settings.late_field
        if watermark_ms <= 0 or field_ is None:
            return records
        kept = []
        clearly_after = from_millis(watermark_ms + 1)  # no rounding brings these back
        for record in records:
            when = record.get(field_)
            if isinstance(when, datetime) and when.tzinfo is not None and when > clearly_after:
                kept.append(record)
            elif isinstance(when, datetime) and to_millis(when) <= watermark_ms:
                seq = record.get("_seq")
                reason = (
                    f"late: {field_} {when.isoformat()} is not after the watermark "
                    f"{from_millis(watermark_ms).isoformat()}"
                )
                self._failures.add(
                    self.settings, _json(record), reason, int(seq) if isinstance(seq, int) else 0
                )
            else:
                kept.append(record)
        return kept

    def _dead_letter_records(self, records: list[dict[str, Any]], exc: Exception) -> None:
        reason = _reason(exc, "process")
        for record in records:
            seq = record.get("_seq")
            self._failures.add(
                self.settings, _json(record), reason, int(seq) if isinstance(seq, int) else 0
            )


def frames_to_records(
    frames: Iterable[pd.DataFrame], names: tuple[str, ...] = (), micros: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """One bucket's chunks of a batch as plain records: nulls as None (not NaN, NaT or
    pd.NA), timestamps as ``datetime`` in UTC; columns named ``names`` by position when
    given (further columns, like the bucket Spark grouped by, are left out); the
    columns at ``micros`` hold microseconds since the epoch and become datetimes.

    Column by column through numpy (``tolist`` builds Python values in C): a pandas
    ``to_dict`` of a bucket's few dozen rows cost more in per-call overhead than the
    rows themselves, ≈25 % of a keyed step's Python time at 2,000 events/s."""
    chunks = [f for f in frames if len(f)]
    if not chunks:
        return []
    labels = list(names) if names else [str(c) for c in chunks[0].columns]
    width = min(len(labels), len(chunks[0].columns))
    columns: list[list[Any]] = [[] for _ in range(width)]
    for chunk in chunks:
        for i, (_, series) in zip(range(width), chunk.items(), strict=False):
            columns[i].extend(_datetimes(series) if i in micros else _plain_values(series))
    return [dict(zip(labels, values, strict=False)) for values in zip(*columns, strict=True)]


def _datetimes(micros: pd.Series) -> list[datetime | None]:
    """Microseconds since the epoch (nulls allowed) as UTC datetimes."""
    stamps = micros.to_numpy(dtype="int64", na_value=0).astype("datetime64[us]")
    if micros.hasnans:
        stamps[micros.isna().to_numpy()] = np.datetime64("NaT")
    return _utc(stamps)


def _utc(stamps: np.ndarray) -> list[datetime | None]:
    """``datetime64`` values (UTC wall clock; NaT allowed) as aware datetimes, NaT as None."""
    return [
        None if v is None else v.replace(tzinfo=UTC)
        for v in stamps.astype("datetime64[us]").tolist()
    ]


def in_order(records: list[dict[str, Any]], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """``records`` sorted by ``fields``, nulls last, stable.

    Compared as they are first (a C key function, five times faster than building a
    null-safe key per record); a null met beside a value (TypeError) or a missing
    field falls back to the null-safe key, which orders the same wherever both work."""
    try:
        return sorted(records, key=operator.itemgetter(*fields))
    except (TypeError, KeyError):
        return sorted(records, key=lambda r: tuple((r.get(f) is None, r.get(f)) for f in fields))


def _plain_values(series: pd.Series) -> list[Any]:
    """A column's values as plain Python values (see :func:`frames_to_records`)."""
    dtype = series.dtype
    if pd.api.types.is_datetime64_any_dtype(dtype):
        return _utc(np.asarray(series.values))  # .values: UTC wall clock, tz-aware or not
    if isinstance(dtype, np.dtype) and dtype.kind in "iub":
        return list(series.to_numpy().tolist())
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        array = series.to_numpy()
        values = array.tolist()
        if np.isnan(array).any():
            return [None if v != v else v for v in values]
        return list(values)
    if series.hasnans:
        series = series.astype(object).where(series.notna(), None)
    return list(series.tolist())


_DTYPES = {"long": "Int64", "boolean": "boolean", "double": "float64"}


def records_to_frame(rows: list[dict[str, Any]], fields: tuple[OutputField, ...]) -> pd.DataFrame:
    """Checked output rows as a DataFrame Spark converts to the declared schema."""
    data: dict[str, Any] = {}
    for spec in fields:
        values = [row[spec.name] for row in rows]
        if spec.kind == "timestamp":
            data[spec.name] = pd.to_datetime(pd.Series(values, dtype=object), utc=True)
        elif spec.kind in _DTYPES:
            data[spec.name] = pd.array(
                [float("nan") if v is None and spec.kind == "double" else v for v in values],
                dtype=_DTYPES[spec.kind],
            )
        else:
            data[spec.name] = pd.Series(values, dtype=object)
    return pd.DataFrame(data)


def _reason(exc: Exception, where: str) -> str:
    return f"{type(exc).__name__} in {where}: {exc}"
