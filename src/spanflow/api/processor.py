"""Keyed process functions: a user's class with its own per-key state and timers.

Subclass :class:`KeyedProcessor`, declare state in :meth:`~KeyedProcessor.init` and
handle each key's records in :meth:`~KeyedProcessor.process`::

    import spanflow as sf

    class TempTracker(sf.KeyedProcessor):
        def init(self, state):
            self.stats = state.value("stats", {"n": "long", "mean": "double"})

        def process(self, key, rows, ctx):
            stats = self.stats.get() or {"n": 0, "mean": 0.0}
            for row in rows:
                stats["n"] += 1
                stats["mean"] += (row["temperature"] - stats["mean"]) / stats["n"]
            self.stats.set(stats)
            yield {"device": key, "n": stats["n"], "mean": stats["mean"]}

    stream.key_by("device").process(TempTracker, output_schema={
        "device": "string", "n": "long", "mean": "double"})

spanflow runs it per key on Spark's ``transformWithState``: state lives in RocksDB,
is checkpointed with the query and restored after a crash, and output is exactly
once with spanflow's sinks. :mod:`spanflow.testing` runs a processor without Spark.

What a processor may rely on:

* ``process(key, rows, ctx)`` gets all of one key's records of a micro-batch, in
  event-time order (arrival order without event time), as dicts. It returns or
  yields output rows (dicts with the fields of ``output_schema``; a key field left
  out is filled in).
* State holds plain data. A state's type is a field type (``"long"``,
  ``"double"``, ``"string"``, ``"boolean"``, ``"timestamp"``, ``"binary"``), a dict
  of them (a record, read back as a dict), or ``"json"`` (the default: numbers,
  strings, booleans, None, lists, dicts and bytes, nested freely). It is stored in
  Spark's own encoding, never pickled.
* Each call is all or nothing: when ``process`` or ``on_timer`` raises, the state
  changes and timers it made are dropped, the key's records of that batch go to the
  dead-letter stream with the exception, and the query goes on.
* Timers run on one clock per processor: event time (the default when the stream
  has event time; a timer fires once the watermark passes it) or processing time
  (``timers="processing_time"``). TTL counts processing time.

The class is referenced as ``module:Class`` in the pipeline spec and imported where
the pipeline runs, so define it at module level. Constructor keyword arguments come
from the step's ``params`` (plain data).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeAlias

Record: TypeAlias = dict[str, Any]
StateType: TypeAlias = str | Mapping[str, str]
"""A field type name, a dict of field name → type (a record), or ``"json"``."""
When: TypeAlias = datetime | float | int
"""A point in time: a datetime, or epoch seconds."""


class ValueState(Protocol):
    """One value per key."""

    def get(self, default: Any = None) -> Any:
        """The value, or ``default`` when there is none (or it expired)."""
        ...

    def set(self, value: Any) -> None: ...

    def exists(self) -> bool: ...

    def clear(self) -> None: ...


class ListState(Protocol):
    """A list per key (append is cheap; reading loads the whole list)."""

    def get(self) -> list[Any]: ...

    def append(self, value: Any) -> None: ...

    def extend(self, values: Iterable[Any]) -> None: ...

    def set(self, values: Iterable[Any]) -> None: ...

    def exists(self) -> bool: ...

    def clear(self) -> None: ...


class MapState(Protocol):
    """A map per key; each entry is read and written on its own."""

    def get(self, key: Any, default: Any = None) -> Any: ...

    def put(self, key: Any, value: Any) -> None: ...

    def contains(self, key: Any) -> bool: ...

    def remove(self, key: Any) -> None: ...

    def keys(self) -> Iterator[Any]: ...

    def values(self) -> Iterator[Any]: ...

    def items(self) -> Iterator[tuple[Any, Any]]: ...

    def exists(self) -> bool: ...

    def clear(self) -> None: ...


class StateDeclarations(Protocol):
    """What :meth:`KeyedProcessor.init` declares its state with.

    ``ttl`` (a duration: ``"1h"`` or seconds) expires an entry that long after it was
    last written, in processing time.
    """

    def value(
        self, name: str, type: StateType = "json", *, ttl: str | float | None = None
    ) -> ValueState: ...

    def list(
        self, name: str, type: StateType = "json", *, ttl: str | float | None = None
    ) -> ListState: ...

    def map(
        self,
        name: str,
        key: StateType = "json",
        value: StateType = "json",
        *,
        ttl: str | float | None = None,
    ) -> MapState: ...


class Timers(Protocol):
    """The current key's timers (on the processor's clock)."""

    def register(self, when: When) -> None:
        """Call ``on_timer`` for this key once the clock passes ``when``."""
        ...

    def register_after(self, seconds: float) -> None:
        """A timer ``seconds`` after the current watermark (event time) or now."""
        ...

    def delete(self, when: When) -> None: ...

    def list(self) -> list[datetime]: ...


class Context(Protocol):
    """What a call knows besides its key and records."""

    @property
    def key(self) -> Any: ...

    @property
    def watermark(self) -> datetime | None:
        """Event time up to which all records are assumed to have arrived (None before
        the first watermark, or without event time)."""
        ...

    @property
    def processing_time(self) -> datetime: ...

    @property
    def timers(self) -> Timers: ...

    def reject(self, record: Record, reason: str) -> None:
        """Send ``record`` to the dead-letter stream with ``reason`` (e.g. too late)
        and go on; it takes effect only if the call succeeds."""
        ...


class KeyedProcessor:
    """Base class of keyed process functions (see the module documentation).

    Override :meth:`process`; :meth:`init`, :meth:`on_timer` and :meth:`close` are
    optional. An instance handles many keys: keep per-key data in declared state,
    never in attributes.
    """

    def init(self, state: StateDeclarations) -> None:
        """Declare state (``state.value``, ``state.list``, ``state.map``)."""

    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterable[Record] | None:
        """Handle one key's records of a micro-batch; return or yield output rows."""
        raise NotImplementedError(f"{type(self).__name__} must define process(key, rows, ctx)")

    def on_timer(self, key: Any, timer: datetime, ctx: Context) -> Iterable[Record] | None:
        """A timer of ``key`` fired; return or yield output rows."""
        return None

    def close(self) -> None:
        """Release what the instance holds (called when Spark is done with it)."""
