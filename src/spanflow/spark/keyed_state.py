"""State of keyed processors over Spark's state API: encodings and all-or-nothing calls.

Runs in Spark's Python workers (inside ``transformWithState``). Spark's state
variables read and write the current key's state in RocksDB, one round trip to the
JVM each. Here every read is cached and every write buffered for the duration of
one call (``process`` of one key, or ``on_timer``): :meth:`Transaction.commit`
writes the changes when the call succeeds, :meth:`Transaction.rollback` drops them
when it raises. A user's processor therefore never leaves half of an update behind,
and a key costs a few round trips per batch however many times it touches a value.

Values are encoded for Spark, never pickled: a field type maps to that Spark type,
a record (dict of field types) to a struct, and ``"json"`` to a string of JSON
(bytes inside it travel as base64 under a marker key).

TTL: in processing-time processors Spark expires entries itself. Spark allows TTL in
no other time mode, so there every entry carries its expiry time (``_expires``, ms)
and is treated as absent once the batch's processing time passes it; it is removed
when next written or cleared.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from pyspark.sql.streaming.stateful_processor import (
    ListState as SparkListState,
)
from pyspark.sql.streaming.stateful_processor import (
    MapState as SparkMapState,
)
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessorHandle,
)
from pyspark.sql.streaming.stateful_processor import (
    ValueState as SparkValueState,
)

from spanflow.api.processor import StateType, When
from spanflow.spec.durations import parse_duration
from spanflow.spec.schema import FIELD_TYPES, SPARK_TYPES_BY_NAME

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BYTES = "__spanflow_bytes__"
_TIME = "__spanflow_time__"
_MISSING: Any = object()


class StateError(TypeError):
    """A state declaration or value that cannot be stored (names the state)."""


# -- encodings --------------------------------------------------------------------------
def to_datetime(value: When) -> datetime:
    """A datetime in UTC from a datetime (naive = UTC) or epoch seconds."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return EPOCH + timedelta(seconds=float(value))
    raise StateError(f"expected a datetime or epoch seconds, got {type(value).__name__}")


def to_millis(value: When) -> int:
    return round((to_datetime(value) - EPOCH) / timedelta(milliseconds=1))


def from_millis(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {_BYTES: base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime):
        return {_TIME: to_micros(value)}
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not plain data")


def _unmark(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES in value:
            return base64.b64decode(value[_BYTES])
        if len(value) == 1 and _TIME in value:
            return EPOCH + timedelta(microseconds=value[_TIME])
        return {k: _unmark(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unmark(v) for v in value]
    return value


def to_micros(value: datetime) -> int:
    """Microseconds since the epoch (a naive datetime is UTC)."""
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    return (aware - EPOCH) // timedelta(microseconds=1)


def json_dumps(value: Any) -> str:
    """Plain data as JSON; bytes and datetimes survive the round trip (:func:`json_loads`)."""
    return orjson.dumps(
        value,
        default=_json_default,
        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME,
    ).decode()


def json_loads(text: str) -> Any:
    value = orjson.loads(text)
    return _unmark(value) if ("__spanflow_" in text) else value


def value_check(kind: str) -> Callable[[Any], Any]:
    """Validate/convert one Python value for a Spark field of spanflow type ``kind``."""

    def string(v: Any) -> Any:
        if isinstance(v, str):
            return v
        raise StateError(f"expected a string, got {type(v).__name__}")

    def long(v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise StateError(f"expected an integer, got {v!r}"[:120])

    def double(v: Any) -> Any:
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
        raise StateError(f"expected a number, got {v!r}"[:120])

    def boolean(v: Any) -> Any:
        if isinstance(v, bool):
            return v
        raise StateError(f"expected a boolean, got {v!r}"[:120])

    def timestamp(v: Any) -> Any:
        return to_datetime(v)

    def binary(v: Any) -> Any:
        if isinstance(v, bytes | bytearray | memoryview):
            return bytes(v)
        raise StateError(f"expected bytes, got {type(v).__name__}")

    checks = {
        "string": string,
        "long": long,
        "double": double,
        "boolean": boolean,
        "timestamp": timestamp,
        "binary": binary,
    }
    return checks[kind]


def _canonical(declared: str) -> str:
    name = FIELD_TYPES.get(declared.strip().rstrip("?").lower())
    if name is None:
        allowed = ", ".join(sorted({*FIELD_TYPES.values(), "json"}))
        raise StateError(f"unknown state type {declared!r} (allowed: {allowed}, or a dict)")
    return name


@dataclass(frozen=True)
class Codec:
    """How one declared state type is stored: Spark fields and the conversions."""

    fields: tuple[tuple[str, str], ...]
    """(name, Spark DDL type) of the stored struct."""
    encode: Callable[[Any], tuple[Any, ...]]
    decode: Callable[[tuple[Any, ...]], Any]

    @property
    def ddl(self) -> str:
        return ", ".join(f"`{n}` {t}" for n, t in self.fields)


def codec_for(declared: StateType) -> Codec:
    """The codec of a state type: a field type, a record (dict) or ``"json"``."""
    if isinstance(declared, Mapping):
        return _record_codec(declared)
    if declared.strip().lower() == "json":
        return Codec((("value", "string"),), lambda v: (json_dumps(v),), lambda t: json_loads(t[0]))
    kind = _canonical(declared)
    check = value_check(kind)
    return Codec(
        (("value", SPARK_TYPES_BY_NAME[kind]),),
        lambda v: (None if v is None else check(v),),
        lambda t: t[0],
    )


def _record_codec(declared: Mapping[str, str]) -> Codec:
    if not declared:
        raise StateError("a record state needs at least one field")
    names = tuple(declared)
    kinds = tuple(_canonical(t) for t in declared.values())
    checks = tuple(value_check(k) for k in kinds)

    def encode(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, Mapping):
            raise StateError(
                f"expected a dict with fields {list(names)}, got {type(value).__name__}"
            )
        extra = set(value) - set(names)
        if extra:
            raise StateError(f"fields {sorted(extra)} are not declared (declared: {list(names)})")
        return tuple(
            None if value.get(n) is None else check(value[n])
            for n, check in zip(names, checks, strict=True)
        )

    def decode(row: tuple[Any, ...]) -> dict[str, Any]:
        return dict(zip(names, row, strict=False))

    fields = tuple((n, SPARK_TYPES_BY_NAME[k]) for n, k in zip(names, kinds, strict=True))
    return Codec(fields, encode, decode)


def _expiring(inner: Codec) -> Codec:
    """``inner`` plus an ``_expires`` (epoch ms) field, for TTL Spark does not run."""

    def decode(row: tuple[Any, ...]) -> Any:
        return inner.decode(tuple(row[:-1]))

    return Codec((*inner.fields, ("_expires", "bigint")), inner.encode, decode)


# -- one call's changes -----------------------------------------------------------------
class Transaction:
    """The buffered changes of one call; the states and timers enlist themselves."""

    def __init__(self) -> None:
        self._members: list[_Buffered] = []
        self.now_ms = 0

    def enlist(self, member: _Buffered) -> None:
        self._members.append(member)

    def begin(self, now_ms: int) -> None:
        self.now_ms = now_ms
        for m in self._members:
            m.reset()

    def commit(self) -> None:
        for m in self._members:
            m.flush()
            m.reset()

    def rollback(self) -> None:
        for m in self._members:
            m.reset()


class _Buffered:
    def reset(self) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class _Ttl:
    """How a state expires: natively in Spark, lazily here, or never."""

    ms: int | None
    lazy: bool

    def expires(self, txn: Transaction) -> int | None:
        return txn.now_ms + self.ms if self.ms is not None and self.lazy else None

    def alive(self, row: tuple[Any, ...], txn: Transaction) -> bool:
        if not self.lazy or self.ms is None:
            return True
        return row[-1] is None or row[-1] > txn.now_ms


class BufferedValue(_Buffered):
    def __init__(
        self, name: str, spark: SparkValueState, codec: Codec, ttl: _Ttl, txn: Transaction
    ):
        self.name, self._spark, self._codec, self._ttl, self._txn = name, spark, codec, ttl, txn
        self._value: Any = _MISSING  # _MISSING: not read yet; None: absent
        self._dirty = False
        txn.enlist(self)

    def reset(self) -> None:
        self._value, self._dirty = _MISSING, False

    def _load(self) -> Any:
        if self._value is _MISSING:
            row = self._spark.get()  # one round trip; None when there is no value
            alive = row is not None and self._ttl.alive(tuple(row), self._txn)
            self._value = self._codec.decode(tuple(row)) if alive else None  # type: ignore[arg-type]
        return self._value

    def get(self, default: Any = None) -> Any:
        value = self._load()
        return default if value is None else value

    def set(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        try:
            self._codec.encode(value)
        except (StateError, TypeError) as exc:
            raise StateError(f"state {self.name!r}: {exc}") from None
        self._value, self._dirty = value, True

    def exists(self) -> bool:
        return self._load() is not None

    def clear(self) -> None:
        self._value, self._dirty = None, True

    def flush(self) -> None:
        if not self._dirty:
            return
        if self._value is None:
            self._spark.clear()
            return
        row = self._codec.encode(self._value)
        if self._ttl.lazy and self._ttl.ms is not None:
            row = (*row, self._ttl.expires(self._txn))
        self._spark.update(row)


class BufferedList(_Buffered):
    def __init__(self, name: str, spark: SparkListState, codec: Codec, ttl: _Ttl, txn: Transaction):
        self.name, self._spark, self._codec, self._ttl, self._txn = name, spark, codec, ttl, txn
        self._items: list[Any] | None = None  # the whole list once read or replaced
        self._appended: list[Any] = []
        self._replaced = False
        txn.enlist(self)

    def reset(self) -> None:
        self._items, self._appended, self._replaced = None, [], False

    def _row(self, value: Any) -> tuple[Any, ...]:
        try:
            row = self._codec.encode(value)
        except (StateError, TypeError) as exc:
            raise StateError(f"state {self.name!r}: {exc}") from None
        if self._ttl.lazy and self._ttl.ms is not None:
            row = (*row, self._ttl.expires(self._txn))
        return row

    def get(self) -> list[Any]:
        if self._items is None:
            stored = [tuple(r) for r in self._spark.get()] if self._spark.exists() else []
            live = [r for r in stored if self._ttl.alive(r, self._txn)]
            self._items = [self._codec.decode(r) for r in live] + self._appended
            if len(live) != len(stored):
                self._replaced = True  # drop the expired entries when writing back
        return list(self._items)

    def append(self, value: Any) -> None:
        self._row(value)
        if self._items is not None:
            self._items.append(value)
        self._appended.append(value)

    def extend(self, values: Iterable[Any]) -> None:
        for v in values:
            self.append(v)

    def set(self, values: Iterable[Any]) -> None:
        items = list(values)
        for v in items:
            self._row(v)
        self._items, self._appended, self._replaced = items, [], True

    def exists(self) -> bool:
        return bool(self.get())

    def clear(self) -> None:
        self.set(())

    def flush(self) -> None:
        if self._replaced:
            items = self._items or []
            if items:
                self._spark.put([self._row(v) for v in items])
            else:
                self._spark.clear()
        elif self._appended:
            self._spark.appendList([self._row(v) for v in self._appended])


class BufferedMap(_Buffered):
    def __init__(
        self,
        name: str,
        spark: SparkMapState,
        key_codec: Codec,
        codec: Codec,
        ttl: _Ttl,
        txn: Transaction,
    ):
        self.name, self._spark, self._key, self._codec = name, spark, key_codec, codec
        self._ttl, self._txn = ttl, txn
        self._cache: dict[Any, Any] = {}  # encoded key → value (None: absent)
        self._written: dict[Any, Any] = {}  # encoded key → value (None: removed)
        self._cleared = False
        txn.enlist(self)

    def reset(self) -> None:
        self._cache, self._written, self._cleared = {}, {}, False

    def _encode_key(self, key: Any) -> tuple[Any, ...]:
        try:
            return self._key.encode(key)
        except (StateError, TypeError) as exc:
            raise StateError(f"state {self.name!r} key: {exc}") from None

    def _encode_value(self, value: Any) -> tuple[Any, ...]:
        try:
            row = self._codec.encode(value)
        except (StateError, TypeError) as exc:
            raise StateError(f"state {self.name!r}: {exc}") from None
        if self._ttl.lazy and self._ttl.ms is not None:
            row = (*row, self._ttl.expires(self._txn))
        return row

    def _stored(self, ekey: tuple[Any, ...]) -> Any:
        if self._cleared:
            return None
        if ekey not in self._cache:
            row = self._spark.getValue(ekey)  # None when the key has no entry
            alive = row is not None and self._ttl.alive(tuple(row), self._txn)
            self._cache[ekey] = self._codec.decode(tuple(row)) if alive else None  # type: ignore[arg-type]
        return self._cache[ekey]

    def get(self, key: Any, default: Any = None) -> Any:
        ekey = self._encode_key(key)
        value = self._written[ekey] if ekey in self._written else self._stored(ekey)
        return default if value is None else value

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.remove(key)
            return
        self._encode_value(value)
        self._written[self._encode_key(key)] = value

    def contains(self, key: Any) -> bool:
        return self.get(key) is not None

    def remove(self, key: Any) -> None:
        self._written[self._encode_key(key)] = None

    def items(self) -> Iterator[tuple[Any, Any]]:
        merged: dict[tuple[Any, ...], Any] = {}
        if not self._cleared and self._spark.exists():
            for k, row in self._spark.iterator():
                if self._ttl.alive(tuple(row), self._txn):
                    merged[tuple(k)] = self._codec.decode(tuple(row))
        merged.update(self._written)
        for ekey, value in merged.items():
            if value is not None:
                yield self._key.decode(ekey), value

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def exists(self) -> bool:
        return any(True for _ in self.items())

    def clear(self) -> None:
        self._cleared, self._written, self._cache = True, {}, {}

    def flush(self) -> None:
        if self._cleared:
            self._spark.clear()
        for ekey, value in self._written.items():
            if value is None:
                if not self._cleared:
                    self._spark.removeKey(ekey)
            else:
                self._spark.updateValue(ekey, self._encode_value(value))


class Declarations:
    """``init``'s view of the state: declares Spark state variables, wrapped."""

    def __init__(self, handle: StatefulProcessorHandle, txn: Transaction, native_ttl: bool):
        self._handle, self._txn, self._native_ttl = handle, txn, native_ttl
        self._names: set[str] = set()
        self.declared: dict[str, BufferedValue | BufferedList | BufferedMap] = {}

    def _ttl(self, name: str, ttl: str | float | None) -> _Ttl:
        if name in self._names:
            raise StateError(f"state {name!r} is declared twice")
        if not name or not name.replace("_", "a").isalnum():
            raise StateError(f"state name {name!r} must be letters, digits and '_'")
        self._names.add(name)
        if ttl is None:
            return _Ttl(None, False)
        seconds = parse_duration(ttl)
        if seconds <= 0:
            raise StateError(f"state {name!r}: ttl must be positive")
        return _Ttl(round(seconds * 1000), not self._native_ttl)

    def _stored(self, codec: Codec, ttl: _Ttl) -> Codec:
        return _expiring(codec) if ttl.lazy else codec

    def value(
        self, name: str, type: StateType = "json", *, ttl: str | float | None = None
    ) -> BufferedValue:
        policy = self._ttl(name, ttl)
        codec = self._stored(codec_for(type), policy)
        spark = self._handle.getValueState(name, codec.ddl, _native_ms(policy))
        state = BufferedValue(name, spark, codec, policy, self._txn)
        self.declared[name] = state
        return state

    def list(
        self, name: str, type: StateType = "json", *, ttl: str | float | None = None
    ) -> BufferedList:
        policy = self._ttl(name, ttl)
        codec = self._stored(codec_for(type), policy)
        spark = self._handle.getListState(name, codec.ddl, _native_ms(policy))
        state = BufferedList(name, spark, codec, policy, self._txn)
        self.declared[name] = state
        return state

    def map(
        self,
        name: str,
        key: StateType = "json",
        value: StateType = "json",
        *,
        ttl: str | float | None = None,
    ) -> BufferedMap:
        policy = self._ttl(name, ttl)
        key_codec = codec_for(key)
        codec = self._stored(codec_for(value), policy)
        spark = self._handle.getMapState(name, key_codec.ddl, codec.ddl, _native_ms(policy))
        state = BufferedMap(name, spark, key_codec, codec, policy, self._txn)
        self.declared[name] = state
        return state


def _native_ms(ttl: _Ttl) -> int | None:
    return None if ttl.lazy else ttl.ms


class BufferedTimers(_Buffered):
    """The current key's timers; registrations and deletions wait for the commit."""

    def __init__(self, handle: StatefulProcessorHandle, txn: Transaction, clock: str) -> None:
        self._handle, self._clock = handle, clock
        self._added: set[int] = set()
        self._deleted: set[int] = set()
        self.base_ms: int | None = None
        """What ``register_after`` counts from (watermark or processing time)."""
        txn.enlist(self)

    def reset(self) -> None:
        self._added, self._deleted = set(), set()

    def _usable(self) -> None:
        if self._clock == "none":
            raise StateError(
                "this processor has no timers: give the step timers='event_time' or "
                "'processing_time'"
            )

    def register(self, when: When) -> None:
        self._usable()
        ms = to_millis(when)
        self._added.add(ms)
        self._deleted.discard(ms)

    def register_after(self, seconds: float) -> None:
        self._usable()
        if self.base_ms is None:
            raise StateError("register_after: no watermark yet; register an absolute time")
        self.register(from_millis(self.base_ms + round(seconds * 1000)))

    def delete(self, when: When) -> None:
        self._usable()
        ms = to_millis(when)
        self._added.discard(ms)
        self._deleted.add(ms)

    def list(self) -> list[datetime]:
        if self._clock == "none":
            return []
        stored = set(self._handle.listTimers())
        return [from_millis(ms) for ms in sorted((stored | self._added) - self._deleted)]

    def flush(self) -> None:
        for ms in sorted(self._deleted):
            self._handle.deleteTimer(ms)
        for ms in sorted(self._added):
            self._handle.registerTimer(ms)
