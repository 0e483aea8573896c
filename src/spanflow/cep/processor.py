"""An event pattern as a keyed processor: per key, events are buffered until the
watermark passes them, then fed to the NFA in event-time order (as FlinkCEP does for
event time); ``within`` deadlines and trailing ``not_followed_by`` stages complete on
event-time timers. The key's NFA state and buffer are one keyed state value, so
partial matches are checkpointed with the query, restored after a crash and moved
with their fragment.

One output row per match: the key, ``rule``, ``match_start`` and ``match_end`` (event
times of its first and last events), the selections; with ``timeouts``, timed-out
partial matches too (``timed_out`` true, ``match_end`` their last event). An event at
or before the watermark when it arrives is dead-lettered with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from spanflow.api.processor import Context, KeyedProcessor, Record, StateDeclarations
from spanflow.cep.nfa import NFA, Match, NFAState
from spanflow.spec.expressions import Compiled, compile_expression
from spanflow.spec.patterns import PatternSpec

MATCH_FIELDS = ("rule", "match_start", "match_end")


def default_select(pattern: PatternSpec) -> dict[str, str]:
    """How many events each stage matched: ``<stage>_count``."""
    return {f"{name}_count": f"count({name})" for name in pattern.positive_names}


def _ms(value: Any) -> int | None:
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return round(aware.timestamp() * 1000)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return round(value * 1000)
    return None


def _encode(value: Any) -> Any:
    """What orjson does not know: pandas' Timestamp (Spark hands timestamps over as
    those), numpy scalars."""
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot keep a {type(value).__name__} in pattern state")


def _datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class PatternMatcher(KeyedProcessor):
    """Runs one compiled pattern per key (see the module documentation)."""

    def __init__(
        self,
        *,
        pattern: Mapping[str, Any],
        event_time: str,
        rule: str,
        select: Mapping[str, str] | None = None,
        timeouts: bool = False,
        timestamps: tuple[str, ...] = (),
    ) -> None:
        self.spec = PatternSpec.model_validate(pattern)
        self.nfa = NFA(self.spec)
        self.event_time = event_time
        self.rule = rule
        self.timeouts = timeouts
        self.timestamps = frozenset(timestamps)
        names = set(self.spec.positive_names)
        chosen = dict(select) if select else default_select(self.spec)
        self.select: dict[str, Compiled] = {
            out: compile_expression(text, stages=names, selection=True)
            for out, text in chosen.items()
        }
        self.kept = self._kept_fields()

    def _kept_fields(self) -> frozenset[str] | None:
        """The event fields conditions and selections read: all a partial match keeps
        of an event (None: keep all)."""
        needed: set[str] = {self.event_time}
        for stage in self.spec.stages:
            for text in (stage.where, stage.until):
                if text is not None:
                    visible = set(self.spec.positive_names)
                    needed |= compile_expression(text, stages=visible).fields
        for compiled in self.select.values():
            needed |= compiled.fields
        return frozenset(needed)

    # -- state ---------------------------------------------------------------------------
    def init(self, state: StateDeclarations) -> None:
        self.state = state.value("cep", "binary")

    def _load(self) -> tuple[NFAState, list[list[Any]], int]:
        blob = self.state.get()
        if not blob:
            return self.nfa.initial_state(), [], 0
        data = orjson.loads(blob)
        st = NFAState.from_json(data["nfa"])
        for _, event in st.events.values():
            self._restore_times(event)
        buffer = data["buffer"]
        for entry in buffer:
            self._restore_times(entry[2])
        return st, buffer, int(data["arrivals"])

    def _restore_times(self, event: dict[str, Any]) -> None:
        for name in self.timestamps & event.keys():
            value = event[name]
            if isinstance(value, str):
                event[name] = datetime.fromisoformat(value)

    def _save(self, st: NFAState, buffer: list[list[Any]], arrivals: int) -> None:
        if not buffer and not st.completed and st.open_matches == 0 and not st.events:
            self.state.clear()
            return
        data = {"nfa": st.to_json(), "buffer": buffer, "arrivals": arrivals}
        self.state.set(orjson.dumps(data, default=_encode))

    # -- calls ---------------------------------------------------------------------------
    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        st, buffer, arrivals = self._load()
        watermark = _ms(ctx.watermark) if ctx.watermark is not None else None
        for row in rows:
            ts = _ms(row.get(self.event_time))
            if ts is None:
                ctx.reject(row, f"pattern {self.rule}: no event time in {self.event_time!r}")
                continue
            if watermark is not None and ts <= watermark:
                ctx.reject(
                    row,
                    f"pattern {self.rule}: event time {_datetime(ts).isoformat()} is not after "
                    f"the watermark {_datetime(watermark).isoformat()} (late)",
                )
                continue
            kept = row if self.kept is None else {k: row.get(k) for k in self.kept}
            buffer.append([ts, arrivals, kept])
            arrivals += 1
        self._schedule(st, buffer, ctx)
        self._save(st, buffer, arrivals)
        return iter(())

    def on_timer(self, key: Any, timer: datetime, ctx: Context) -> Iterator[Record]:
        watermark = _ms(ctx.watermark) if ctx.watermark is not None else _ms(timer)
        assert watermark is not None
        st, buffer, arrivals = self._load()
        out = self._run(st, buffer, watermark)
        buffer = [e for e in buffer if e[0] > watermark]
        self._schedule(st, buffer, ctx)
        self._save(st, buffer, arrivals)
        return iter(out)

    def _run(self, st: NFAState, buffer: list[list[Any]], watermark: int) -> list[Record]:
        """Feed the buffered events up to the watermark in event-time order, then move
        time to the watermark; the rows of the matches and time-outs."""
        due = sorted((e for e in buffer if e[0] <= watermark), key=lambda e: (e[0], e[1]))
        rows: list[Record] = []
        for ts, _, event in due:
            self._emit(self.nfa.advance_time(st, ts), rows)
            rows.extend(self._row(m) for m in self.nfa.process(st, event, ts))
        self._emit(self.nfa.advance_time(st, watermark), rows)
        return rows

    def _emit(self, done: tuple[list[Match], list[Match]], rows: list[Record]) -> None:
        matches, timed_out = done
        rows.extend(self._row(m) for m in matches)
        if self.timeouts:
            rows.extend(self._row(m) for m in timed_out)

    def _schedule(self, st: NFAState, buffer: list[list[Any]], ctx: Context) -> None:
        """A timer at the earliest buffered event and at the earliest ``within``
        deadline: when the watermark passes either, there is work to do."""
        wanted: set[int] = set()
        if buffer:
            wanted.add(min(e[0] for e in buffer))
        if self.nfa.window:
            starts = [p.start_ts for p in st.partials if p.start is not None]
            if starts:
                wanted.add(min(starts) + self.nfa.window)
        if not wanted:
            return
        have = {_ms(t) for t in ctx.timers.list()}
        for when in wanted - have:
            ctx.timers.register(_datetime(when))

    def _row(self, match: Match) -> Record:
        events = [e for stage in match.stages.values() for e in stage]
        last = max(events, key=lambda e: _ms(e.get(self.event_time)) or 0) if events else {}
        row: Record = {
            "rule": self.rule,
            "match_start": _datetime(match.start_ts),
            "match_end": _datetime(match.end_ts),
        }
        if self.timeouts:
            row["timed_out"] = match.timed_out_at is not None
        for name, compiled in self.select.items():
            value = compiled.evaluate(last, match.stages)
            if isinstance(value, list):
                value = orjson.dumps(value, default=str).decode()
            row[name] = value
        return row
