"""Run a :class:`spanflow.KeyedProcessor` as Spark's ``StatefulProcessor``.

Runs in Spark's Python workers. For each key of a micro-batch, Spark calls
``handleInputRows``; here that becomes one all-or-nothing call of the user's
``process`` (:mod:`spanflow.spark.keyed_state`): records as dicts in event-time (or
arrival) order, output checked against the declared schema, and on an exception the
state left as it was and the key's records dead-lettered with the reason. Timers
fire through ``handleExpiredTimer`` the same way. Dead letters are published when
Spark closes the processor at the end of the task, with ids derived from the batch
and the record, so a replayed batch does not dead-letter twice.

The adapter is pickled by Spark with everything it holds: the settings are plain
data plus the processor class (imported by reference where it is importable).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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
from spanflow.spark.keyed_state import (
    BufferedMap,
    BufferedTimers,
    Declarations,
    StateError,
    Transaction,
    from_millis,
    to_millis,
    value_check,
)

Clock = str  # "event_time" | "processing_time" | "none"


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


class ProcessorAdapter(StatefulProcessor):
    """Spark's side of a keyed processor step."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings

    # -- Spark's hooks --------------------------------------------------------------
    def init(self, handle: StatefulProcessorHandle) -> None:
        s = self.settings
        self._txn = Transaction()
        self._timers = BufferedTimers(handle, self._txn, s.clock)
        self._failures = _Failures()
        self._checks = tuple((f, value_check(f.kind)) for f in s.output)
        self._user = s.factory()
        native = s.clock == "processing_time" if s.native_ttl is None else s.native_ttl
        self._declarations = Declarations(handle, self._txn, native_ttl=native)
        self._user.init(self._declarations)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        records = frames_to_records(rows, self.settings.input_names)
        if self.settings.late_field is not None:
            records = self._without_late(records, timerValues.getCurrentWatermarkInMs())
            if not records:
                return iter(())
        if self.settings.order_by:
            records.sort(key=self._order)
        call = self._begin(key, timerValues, records)
        try:
            out = self._rows(self._user.process(call.key, records, call), call.key)
        except Exception as exc:
            self._txn.rollback()
            self._dead_letter_records(records, exc)
            return iter(())
        self._txn.commit()
        self._dead_letter_rejected(call)
        return self._frames(out)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        call = self._begin(key, timerValues, [])
        when = from_millis(expiredTimerInfo.getExpiryTimeInMs())
        try:
            out = self._rows(self._user.on_timer(call.key, when, call), call.key)
        except Exception as exc:
            self._txn.rollback()
            payload = _json({"key": call.key, "timer": when.isoformat()})
            self._failures.add(self.settings, payload, _reason(exc, "on_timer"), 0)
            return iter(())
        self._txn.commit()
        self._dead_letter_rejected(call)
        return self._frames(out)

    def close(self) -> None:
        try:
            self._user.close()
        finally:
            letters = self.take_dead_letters()
            if letters and self.settings.dead_letters:
                s = self.settings
                send_dead_letters(s.nats_url, s.pipeline, s.step, letters)

    # -- for spanflow.testing -----------------------------------------------------------
    def take_dead_letters(self) -> list[DeadLetter]:
        """The dead letters of failed calls since the last take."""
        letters, self._failures = self._failures.letters, _Failures()
        return letters

    def peek(self, name: str, now_ms: int) -> Any:
        """A declared state's value for the handle's current key, as the processor sees
        it (a list for a list state, a dict for a map state)."""
        state = self._declarations.declared.get(name)
        if state is None:
            raise KeyError(
                f"no state named {name!r} (declared: {sorted(self._declarations.declared)})"
            )
        self._txn.begin(now_ms)
        try:
            if isinstance(state, BufferedMap):
                return dict(state.items())
            return state.get()
        finally:
            self._txn.rollback()

    # -- helpers ----------------------------------------------------------------------
    def _begin(self, key: Any, tv: TimerValues, records: list[dict[str, Any]]) -> _Call:
        watermark = tv.getCurrentWatermarkInMs()
        now = tv.getCurrentProcessingTimeInMs()
        now = now if now > 0 else round(time.time() * 1000)
        self._txn.begin(now)
        if self.settings.clock == "processing_time":
            self._timers.base_ms = now
        else:
            self._timers.base_ms = watermark if watermark > 0 else self._latest(records)
        return _Call(self._key_value(key), watermark, now, self._timers)

    def _key_value(self, key: tuple[Any, ...]) -> Any:
        """A one-field key as its value, a composite key as a tuple (Spark passes a tuple
        of the key's fields; spanflow.testing passes a composite key as one tuple)."""
        if len(self.settings.key_fields) == 1:
            return key[0]
        if len(key) == 1 and isinstance(key[0], tuple):
            return key[0]
        return tuple(key)

    def _latest(self, records: list[dict[str, Any]]) -> int | None:
        if not self.settings.order_by or not records:
            return None
        last = records[-1].get(self.settings.order_by[0])
        if isinstance(last, datetime | int | float) and not isinstance(last, bool):
            return to_millis(last)
        return None

    def _order(self, record: dict[str, Any]) -> tuple[Any, ...]:
        return tuple((record.get(f) is None, record.get(f)) for f in self.settings.order_by)

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
        for item in produced or ():
            if not isinstance(item, dict):
                raise StateError(f"an output row must be a dict, got {type(item).__name__}")
            extra = [k for k in item if k not in keys and all(f.name != k for f, _ in self._checks)]
            if extra:
                names = [f.name for f, _ in self._checks]
                raise StateError(f"output fields {extra} are not in output_schema {names}")
            values: dict[str, Any] = {}
            for spec, check in self._checks:
                value = item.get(spec.name, keys.get(spec.name))
                if value is None:
                    if not spec.optional and spec.name not in item:
                        raise StateError(f"output row has no field {spec.name!r}")
                    values[spec.name] = None
                    continue
                try:
                    values[spec.name] = check(value)
                except StateError as exc:
                    raise StateError(f"output field {spec.name!r}: {exc}") from None
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
        for record in records:
            when = record.get(field_)
            if isinstance(when, datetime) and to_millis(when) <= watermark_ms:
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
    frames: Iterable[pd.DataFrame], names: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """One key's chunks of a batch as plain records: nulls as None (not NaN, NaT or
    pd.NA), timestamps in UTC; columns named ``names`` by position when given."""
    chunks = [f for f in frames if len(f)]
    if not chunks:
        return []
    df = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
    if names and len(names) == len(df.columns):
        df = df.set_axis(list(names), axis=1)
    for i in range(len(df.columns)):
        series = df.iloc[:, i]
        changed = False
        if pd.api.types.is_datetime64_any_dtype(series) and series.dt.tz is None:
            series, changed = series.dt.tz_localize("UTC"), True
        if series.hasnans:
            series, changed = series.astype(object).where(series.notna(), None), True
        if changed:
            df.isetitem(i, series)
    records: list[dict[str, Any]] = df.to_dict("records")
    return records


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
