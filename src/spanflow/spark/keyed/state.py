"""State of keyed processors over Spark's state API: encodings and all-or-nothing calls.

Runs in Spark's Python workers (inside ``transformWithState``). A key's declared
states (values, lists, maps) and its timers are kept together as one stored value, a
dict of *slots* packed with MessagePack: a call reads it with one round trip to the
JVM the first time it needs it and writes it back with one when it changed. Every
read is served from it and every write buffered for the duration of one call
(``process`` of one key, or ``on_timer``): :meth:`Transaction.commit` folds the
changes in when the call succeeds, :meth:`Transaction.rollback` drops them when it
raises. A user's processor therefore never leaves half of an update behind, and a
key costs two round trips per batch however many states it touches (Spark's own
state variables cost one round trip per read and per write of each, which made a
keyed batch of 100 keys three times slower; docs/benchmarks.md).

Values are checked against their declared types, then packed — never pickled
(checkpoints travel between hosts): a field type as itself, a record (dict of field
types) as its fields in order, and ``"json"`` as a string of JSON (bytes inside it
travel as base64 under a marker key).

TTL: every entry carries its expiry time (ms) and is treated as absent once the
batch's processing time passes it; it is dropped when its key is next written. When
every state of a processing-time processor has a TTL, Spark also drops a key's whole
stored value once the longest TTL has passed since it was written, so keys that never
come back do not stay.

A processor's whole stored state per key is rewritten when it changes: a state of
thousands of entries per key (a large map or list) costs that much per batch.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import msgpack
import numpy as np
import orjson

from spanflow.api.processor import StateType, When
from spanflow.spec.durations import parse_duration
from spanflow.spec.schema import FIELD_TYPES

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
        if isinstance(v, np.integer):  # numpy's numbers, e.g. from a user's np.sum
            return int(v)
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise StateError(f"expected an integer, got {v!r}"[:120])

    def double(v: Any) -> Any:
        if type(v) is float:  # the usual case, checked first: it is most of a row's cost
            return v
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
        raise StateError(f"expected a number, got {v!r}"[:120])

    def boolean(v: Any) -> Any:
        if isinstance(v, bool):
            return v
        if isinstance(v, np.bool_):
            return bool(v)
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
    """How one declared state type is stored: a checked value as a tuple of plain
    fields (packed into the key's slots) and back."""

    encode: Callable[[Any], tuple[Any, ...]]
    decode: Callable[[tuple[Any, ...]], Any]


def codec_for(declared: StateType) -> Codec:
    """The codec of a state type: a field type, a record (dict) or ``"json"``."""
    if isinstance(declared, Mapping):
        return _record_codec(declared)
    if declared.strip().lower() == "json":
        return Codec(lambda v: (json_dumps(v),), lambda t: json_loads(t[0]))
    kind = _canonical(declared)
    check = value_check(kind)
    return Codec(lambda v: (None if v is None else check(v),), lambda t: t[0])


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

    return Codec(encode, decode)


def _expiring(inner: Codec) -> Codec:
    """``inner`` plus an ``_expires`` (epoch ms) field, for TTL counted here."""

    def decode(row: tuple[Any, ...]) -> Any:
        return inner.decode(tuple(row[:-1]))

    return Codec(inner.encode, decode)


# -- a key's stored state ---------------------------------------------------------------
TIMERS_SLOT = "__timers__"
"""The slot of a key's stored state that lists its timers (epoch ms)."""


def pack(value: Any) -> bytes:
    """Plain data (with datetimes and bytes) as MessagePack: the form of a key's
    state and of its key in Spark's state store. Never pickle: checkpoints travel."""
    return msgpack.packb(value, datetime=True, use_bin_type=True, default=_packable)


def _packable(value: Any) -> Any:
    """What MessagePack cannot pack as it is: pandas' timestamps (a datetime subclass)
    as datetimes, naive datetimes as UTC, numpy scalars as Python numbers."""
    if isinstance(value, datetime):
        plain = value.to_pydatetime(warn=False) if hasattr(value, "to_pydatetime") else value
        return plain if plain.tzinfo else plain.replace(tzinfo=UTC)
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} cannot be stored")


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, timestamp=3, raw=False, strict_map_key=False)


# -- one call's changes -----------------------------------------------------------------
class Transaction:
    """The buffered changes of one call on one key; the states and timers enlist.

    A key's declared states live together in one stored value (a dict of *slots*, one
    per state, read with one round trip when first needed): :meth:`commit` folds the
    call's changes into the slots and says whether they changed; the adapter writes
    them back with one round trip. :meth:`rollback` drops the call's changes."""

    def __init__(self) -> None:
        self._members: list[_Buffered] = []
        self.now_ms = 0
        self._load: Callable[[], dict[str, Any]] = dict
        self._slots: dict[str, Any] | None = None
        self.changed = False

    def enlist(self, member: _Buffered) -> None:
        self._members.append(member)

    def begin(self, now_ms: int, load: Callable[[], dict[str, Any]] = dict) -> None:
        self.now_ms = now_ms
        self._load, self._slots, self.changed = load, None, False
        for m in self._members:
            m.reset()

    @property
    def slots(self) -> dict[str, Any]:
        """The key's stored slots (loaded on first use)."""
        if self._slots is None:
            self._slots = self._load()
        return self._slots

    def slot(self, name: str) -> Any:
        return self.slots.get(name)

    def put(self, name: str, stored: Any) -> None:
        """Replace a slot (``None`` removes it)."""
        if stored is None:
            if name in self.slots:
                del self.slots[name]
                self.changed = True
            return
        self.slots[name] = stored
        self.changed = True

    def commit(self) -> bool:
        """Fold the call's changes into the slots; True when they changed."""
        for m in self._members:
            m.flush()
        for m in self._members:
            m.reset()
        return self.changed

    def rollback(self) -> None:
        for m in self._members:
            m.reset()
        self._slots, self.changed = None, False


class _Buffered:
    def reset(self) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class _Ttl:
    """How a state's entries expire: each carries its expiry time (ms), or none."""

    ms: int | None

    @property
    def lazy(self) -> bool:
        return self.ms is not None

    def expires(self, txn: Transaction) -> int | None:
        return txn.now_ms + self.ms if self.ms is not None else None

    def alive(self, row: tuple[Any, ...] | list[Any], txn: Transaction) -> bool:
        if self.ms is None:
            return True
        return row[-1] is None or row[-1] > txn.now_ms


class BufferedValue(_Buffered):
    def __init__(self, name: str, codec: Codec, ttl: _Ttl, txn: Transaction):
        self.name, self._codec, self._ttl, self._txn = name, codec, ttl, txn
        self._value: Any = _MISSING  # _MISSING: not read yet; None: absent
        self._dirty = False
        txn.enlist(self)

    def reset(self) -> None:
        self._value, self._dirty = _MISSING, False

    def _load(self) -> Any:
        if self._value is _MISSING:
            row = self._txn.slot(self.name)
            alive = row is not None and self._ttl.alive(row, self._txn)
            self._value = self._codec.decode(tuple(row)) if alive else None
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
            self._txn.put(self.name, None)
            return
        row = list(self._codec.encode(self._value))
        if self._ttl.lazy:
            row.append(self._ttl.expires(self._txn))
        self._txn.put(self.name, row)


class BufferedList(_Buffered):
    def __init__(self, name: str, codec: Codec, ttl: _Ttl, txn: Transaction):
        self.name, self._codec, self._ttl, self._txn = name, codec, ttl, txn
        self._items: list[Any] | None = None  # the whole list once read or replaced
        self._appended: list[Any] = []
        self._replaced = False
        txn.enlist(self)

    def reset(self) -> None:
        self._items, self._appended, self._replaced = None, [], False

    def _row(self, value: Any) -> list[Any]:
        try:
            row = list(self._codec.encode(value))
        except (StateError, TypeError) as exc:
            raise StateError(f"state {self.name!r}: {exc}") from None
        if self._ttl.lazy:
            row.append(self._ttl.expires(self._txn))
        return row

    def _stored(self) -> list[list[Any]]:
        return self._txn.slot(self.name) or []

    def get(self) -> list[Any]:
        if self._items is None:
            stored = self._stored()
            live = [r for r in stored if self._ttl.alive(r, self._txn)]
            self._items = [self._codec.decode(tuple(r)) for r in live] + self._appended
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
            self._txn.put(self.name, [self._row(v) for v in items] or None)
        elif self._appended:
            rows = [self._row(v) for v in self._appended]
            self._txn.put(self.name, [*self._stored(), *rows])


class BufferedMap(_Buffered):
    def __init__(self, name: str, key_codec: Codec, codec: Codec, ttl: _Ttl, txn: Transaction):
        self.name, self._key, self._codec = name, key_codec, codec
        self._ttl, self._txn = ttl, txn
        self._entries: dict[tuple[Any, ...], list[Any]] | None = None  # encoded key → row
        self._written: dict[tuple[Any, ...], Any] = {}  # encoded key → value (None: removed)
        self._cleared = False
        txn.enlist(self)

    def reset(self) -> None:
        self._entries, self._written, self._cleared = None, {}, False

    def _encode_key(self, key: Any) -> tuple[Any, ...]:
        try:
            return self._key.encode(key)
        except (StateError, TypeError) as exc:
            raise StateError(f"state {self.name!r} key: {exc}") from None

    def _encode_value(self, value: Any) -> list[Any]:
        try:
            row = list(self._codec.encode(value))
        except (StateError, TypeError) as exc:
            raise StateError(f"state {self.name!r}: {exc}") from None
        if self._ttl.lazy:
            row.append(self._ttl.expires(self._txn))
        return row

    def _stored(self) -> dict[tuple[Any, ...], list[Any]]:
        """The live stored entries (all of them are in the key's slots anyway)."""
        if self._entries is None:
            pairs = [] if self._cleared else (self._txn.slot(self.name) or [])
            self._entries = {tuple(k): row for k, row in pairs if self._ttl.alive(row, self._txn)}
        return self._entries

    def get(self, key: Any, default: Any = None) -> Any:
        ekey = self._encode_key(key)
        if ekey in self._written:
            value = self._written[ekey]
        else:
            row = self._stored().get(ekey)
            value = None if row is None else self._codec.decode(tuple(row))
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
        merged: dict[tuple[Any, ...], Any] = {
            k: self._codec.decode(tuple(row)) for k, row in self._stored().items()
        }
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
        self._cleared, self._written, self._entries = True, {}, {}

    def flush(self) -> None:
        if not self._cleared and not self._written:
            if self._entries is not None and len(self._entries) != len(
                self._txn.slot(self.name) or []
            ):
                self._write(dict(self._entries))  # drop the expired entries
            return
        entries = dict(self._stored())
        for ekey, value in self._written.items():
            if value is None:
                entries.pop(ekey, None)
            else:
                entries[ekey] = self._encode_value(value)
        self._write(entries)

    def _write(self, entries: dict[tuple[Any, ...], list[Any]]) -> None:
        self._txn.put(self.name, [[list(k), row] for k, row in entries.items()] or None)


_S = TypeVar("_S", "BufferedValue", "BufferedList", "BufferedMap")


class Declarations:
    """``init``'s view of the state: declares a processor's states, buffered."""

    def __init__(self, txn: Transaction) -> None:
        self._txn = txn
        self._names: set[str] = set()
        self.declared: dict[str, BufferedValue | BufferedList | BufferedMap] = {}
        self.ttls: dict[str, int | None] = {}
        """Each state's TTL in ms (None: kept until cleared)."""

    def _ttl(self, name: str, ttl: str | float | None) -> _Ttl:
        if name in self._names:
            raise StateError(f"state {name!r} is declared twice")
        if not name or not name.replace("_", "a").isalnum() or name.startswith("__"):
            raise StateError(f"state name {name!r} must be letters, digits and '_'")
        self._names.add(name)
        if ttl is None:
            self.ttls[name] = None
            return _Ttl(None)
        seconds = parse_duration(ttl)
        if seconds <= 0:
            raise StateError(f"state {name!r}: ttl must be positive")
        self.ttls[name] = round(seconds * 1000)
        return _Ttl(self.ttls[name])

    def _declare(self, state: _S) -> _S:
        self.declared[state.name] = state
        return state

    def _stored(self, codec: Codec, ttl: _Ttl) -> Codec:
        return _expiring(codec) if ttl.lazy else codec

    def value(
        self, name: str, type: StateType = "json", *, ttl: str | float | None = None
    ) -> BufferedValue:
        policy = self._ttl(name, ttl)
        return self._declare(
            BufferedValue(name, self._stored(codec_for(type), policy), policy, self._txn)
        )

    def list(
        self, name: str, type: StateType = "json", *, ttl: str | float | None = None
    ) -> BufferedList:
        policy = self._ttl(name, ttl)
        return self._declare(
            BufferedList(name, self._stored(codec_for(type), policy), policy, self._txn)
        )

    def map(
        self,
        name: str,
        key: StateType = "json",
        value: StateType = "json",
        *,
        ttl: str | float | None = None,
    ) -> BufferedMap:
        policy = self._ttl(name, ttl)
        codec = self._stored(codec_for(value), policy)
        return self._declare(BufferedMap(name, codec_for(key), codec, policy, self._txn))

    def longest_ttl(self) -> int | None:
        """The TTL after which a key's whole state has expired: the longest of its
        states' TTLs, or None when one of them is kept until cleared (or none is
        declared)."""
        if not self.ttls or any(ms is None for ms in self.ttls.values()):
            return None
        return max(ms for ms in self.ttls.values() if ms is not None)


class BufferedTimers(_Buffered):
    """The current key's timers, kept in its slots; changes wait for the commit.

    After a commit, :attr:`registered` and :attr:`removed` say which times the key
    gained and lost, for the adapter's timer index (Spark's timers belong to a
    bucket of keys, see :mod:`spanflow.spark.keyed.processor`)."""

    def __init__(self, txn: Transaction, clock: str) -> None:
        self._txn, self._clock = txn, clock
        self._added: set[int] = set()
        self._deleted: set[int] = set()
        self._fired: set[int] = set()
        self.registered: list[int] = []
        self.removed: list[int] = []
        self.base_ms: int | None = None
        """What ``register_after`` counts from (watermark or processing time)."""
        txn.enlist(self)

    def reset(self) -> None:
        self._added, self._deleted, self._fired = set(), set(), set()

    def _usable(self) -> None:
        if self._clock == "none":
            raise StateError(
                "this processor has no timers: give the step timers='event_time' or "
                "'processing_time'"
            )

    def _stored(self) -> set[int]:
        return set(self._txn.slot(TIMERS_SLOT) or ())

    def fired(self, ms: int) -> None:
        """The timer at ``ms`` fired: it leaves the key's list (the index already
        dropped it)."""
        self._fired.add(ms)
        self._added.discard(ms)

    def register(self, when: When) -> None:
        self._usable()
        ms = to_millis(when)
        self._added.add(ms)
        self._deleted.discard(ms)
        self._fired.discard(ms)

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
        current = (self._stored() | self._added) - self._deleted - self._fired
        return [from_millis(ms) for ms in sorted(current)]

    def flush(self) -> None:
        self.registered, self.removed = [], []
        if not (self._added or self._deleted or self._fired):
            return
        stored = self._stored()
        current = (stored | self._added) - self._deleted - self._fired
        self.registered = sorted(current - stored)
        self.removed = sorted((stored - current) - self._fired)
        if current != stored:
            self._txn.put(TIMERS_SLOT, sorted(current) or None)
