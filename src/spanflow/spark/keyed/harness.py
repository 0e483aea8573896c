"""Run a keyed processor without a query: the same adapter and state code as in Spark,
over PySpark's in-memory ``TwsTester`` (see :class:`spanflow.testing.KeyedProcessorTest`)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import pandas as pd
from pyspark.sql.streaming.tws_tester import TwsTester

from spanflow.api.processor import KeyedProcessor, When
from spanflow.spark.keyed.processor import ProcessorAdapter, ProcessorSettings, frames_to_records
from spanflow.spark.keyed.state import json_loads, to_millis

BUCKET = 0
"""The harness's one bucket (Spark spreads keys over several, see compile.process)."""
_TIME_MODES = {"event_time": "EventTime", "processing_time": "ProcessingTime", "none": "None"}


class KeyedProcessorTest:
    """Feed a processor records and clock ticks; get its output, dead letters and state.

    >>> import spanflow as sf
    >>> from spanflow.testing import KeyedProcessorTest
    >>> class Counter(sf.KeyedProcessor):
    ...     def init(self, state):
    ...         self.n = state.value("n", "long")
    ...     def process(self, key, rows, ctx):
    ...         self.n.set(self.n.get(0) + len(rows))
    ...         yield {"n": self.n.get()}
    >>> t = KeyedProcessorTest(Counter, key="device",
    ...                        output_schema={"device": "string", "n": "long"})
    >>> t.process([{"device": "a"}, {"device": "b"}, {"device": "a"}])
    [{'device': 'a', 'n': 2}, {'device': 'b', 'n': 1}]
    >>> t.process([{"device": "a"}])
    [{'device': 'a', 'n': 3}]
    >>> t.state("n", "a")
    3

    ``process`` treats its records as one micro-batch: grouped by key (keys in order of
    first appearance), each key's records in event-time order. Event-time timers fire
    on :meth:`advance_watermark`, processing-time timers on
    :meth:`advance_processing_time`. TTL counts the harness's processing time.
    """

    def __init__(
        self,
        processor: type[KeyedProcessor],
        *,
        key: str | tuple[str, ...],
        output_schema: Mapping[str, str],
        event_time: str | None = None,
        timers: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        from spanflow.spark.compile.process import output_fields

        self.key_fields = (key,) if isinstance(key, str) else tuple(key)
        self.event_time = event_time
        overrides_timer = processor.on_timer is not KeyedProcessor.on_timer
        default = "event_time" if event_time else ("processing_time" if overrides_timer else "none")
        self.clock = timers or default
        if self.clock == "event_time" and not event_time:
            raise ValueError("event-time timers need event_time= (the records' time field)")
        self.settings = ProcessorSettings(
            factory=functools.partial(processor, **dict(params or {})),
            key_fields=self.key_fields,
            output=output_fields(output_schema),
            clock=self.clock,
            order_by=(event_time,) if event_time else (),
            dead_letters=False,
            native_ttl=False,
        )
        self.adapter = ProcessorAdapter(self.settings)
        extractor = (lambda row: to_millis(row[event_time])) if event_time else None
        self._tester = TwsTester(
            self.adapter, timeMode=_TIME_MODES[self.clock], eventTimeExtractor=extractor
        )
        self._now_ms = 1
        self.dead_letters: list[tuple[dict[str, Any], str]] = []
        """(record, reason) of every record a failed call sent to the dead letters."""

    def process(self, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Run one micro-batch of ``records``; the output rows as dicts."""
        rows = list(records)
        for record in rows:
            self._key_of(record)  # a record without its key fails here, as in Spark
        if not rows:
            return []
        names = list(dict.fromkeys(k for r in rows for k in r))
        # Object columns keep each value as given (no numeric or time inference).
        frame = pd.DataFrame({n: pd.Series([r.get(n) for r in rows], dtype=object) for n in names})
        # One bucket holds every key: the adapter splits it by key, as in Spark.
        self.adapter.settings = replace(self.adapter.settings, input_names=tuple(names))
        return self._collect([self._tester.testInPandas(BUCKET, frame)])

    def advance_watermark(self, to: When) -> list[dict[str, Any]]:
        """Move event time to ``to``; the output of the timers that fired."""
        return self._collect(self._tester.setWatermark(to_millis(to)))

    def advance_processing_time(self, to: When) -> list[dict[str, Any]]:
        """Move processing time to ``to``; the output of the timers that fired."""
        self._now_ms = to_millis(to)
        if self.clock != "processing_time":
            return []
        return self._collect(self._tester.setProcessingTime(self._now_ms))

    def state(self, name: str, key: Any) -> Any:
        """A state's value for ``key`` as the processor sees it."""
        self._tester.handle.setGroupingKey(BUCKET)
        return self.adapter.peek(name, key, self._now_ms)

    def _key_of(self, record: Mapping[str, Any]) -> Any:
        missing = [f for f in self.key_fields if f not in record]
        if missing:
            raise KeyError(f"record has no key field(s) {missing}: {dict(record)}")
        values = tuple(record[f] for f in self.key_fields)
        return values[0] if len(values) == 1 else values

    def _collect(self, produced: Any) -> list[dict[str, Any]]:
        for letter in self.adapter.take_dead_letters():
            self.dead_letters.append((json_loads(letter.data.decode()), letter.reason))
        frames = [produced] if isinstance(produced, pd.DataFrame) else list(produced)
        return frames_to_records(f for f in frames if isinstance(f, pd.DataFrame))
