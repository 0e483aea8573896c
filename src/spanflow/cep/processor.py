"""Event patterns as a keyed processor: per key, events are buffered until the
watermark passes them, then fed to each rule's NFA in event-time order (as FlinkCEP
does for event time); ``within`` deadlines and trailing ``not_followed_by`` stages
complete on event-time timers. A key's buffer and the NFA state of each rule are one
keyed state value, so partial matches are checkpointed with the query, restored
after a crash and moved with their fragment.

One output row per match: the key, ``rule``, ``match_start`` and ``match_end`` (event
times of its first and last events) and the rule's selections; with ``timeouts``,
timed-out partial matches too (``timed_out`` true). An event at or before the
watermark when it arrives is dead-lettered with the reason.

**Rules that change.** With a rule set (:mod:`spanflow.cep.rule_store`) the rules are
the version pinned for the micro-batch; rows then carry ``version`` and the
selections as a JSON object in ``values``. When a key meets a new version, rules
whose definition is unchanged keep their partial matches, and so do rules whose
stages only grew at the end (after a plain last stage, with the same ``within`` and
skip strategy) or whose selections changed; other changed or removed rules lose
theirs, new rules start empty; buffered events not yet matched go to the new rules.
The same holds for a pipeline upgraded on its checkpoint (:mod:`spanflow.spec.upgrade`).
Events are then kept whole (a new rule may read any field).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from spanflow.api.processor import Context, KeyedProcessor, Record, StateDeclarations
from spanflow.cep.filter_index import FilterIndex
from spanflow.cep.nfa import NFA, Match, NFAState
from spanflow.spec.expressions import Compiled, compile_expression
from spanflow.spec.patterns import RuleSpec, gate


def _ms(value: Any) -> int | None:
    ns = getattr(value, "value", None)
    if isinstance(ns, int) and isinstance(value, datetime):
        return round(ns / 1_000_000)  # pandas' Timestamp (how Spark hands them over): cheap
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


@dataclass(frozen=True)
class CompiledRule:
    """A rule ready to run: its NFA and compiled selections."""

    spec: RuleSpec
    nfa: NFA
    select: dict[str, Compiled]
    fingerprint: str
    gate: Compiled | None
    """What an event must meet to start a match (None: any event may)."""
    fields: frozenset[str]
    """The event fields its conditions and selections read."""
    prints: dict[str, Any]
    """Saved with its partial matches: the rule's, its stages' and its frame's
    fingerprints, and whether appended stages may carry them on (:func:`_carried`)."""

    @staticmethod
    def of(spec: RuleSpec) -> CompiledRule:
        stages = set(spec.pattern.positive_names)
        select = {
            out: compile_expression(text, stages=stages, selection=True)
            for out, text in spec.selections.items()
        }
        start = gate(spec.pattern)
        gate_fn = compile_expression(start) if start is not None else None
        fields: set[str] = set()
        for stage in spec.pattern.stages:
            for text in (stage.where, stage.until):
                if text is not None:
                    fields |= compile_expression(text, stages=stages).fields
        for compiled in select.values():
            fields |= compiled.fields
        nfa = NFA(spec.pattern)
        prints = {
            "fp": spec.fingerprint(),
            "stages": list(spec.pattern.stage_prints()),
            "frame": spec.pattern.frame_print(),
            "extendable": spec.pattern.extendable,
        }
        return CompiledRule(
            spec, nfa, select, spec.fingerprint(), gate_fn, frozenset(fields), prints
        )


_compiled: dict[str, CompiledRule] = {}


def compiled_rule(rule: RuleSpec | Mapping[str, Any]) -> CompiledRule:
    """Compiled once per worker process per rule definition: Spark builds a processor
    per task and micro-batch, and validating and compiling a rule parses its SQL."""
    if isinstance(rule, RuleSpec):
        key = rule.fingerprint()
    else:
        key = orjson.dumps(rule, option=orjson.OPT_SORT_KEYS).decode()
    compiled = _compiled.get(key)
    if compiled is None:
        if len(_compiled) > 10_000:
            _compiled.clear()
        spec = rule if isinstance(rule, RuleSpec) else RuleSpec.model_validate(rule)
        compiled = _compiled[key] = CompiledRule.of(spec)
    return compiled


_indexes: dict[tuple[str, ...], FilterIndex] = {}


def filter_index(rules: Sequence[CompiledRule]) -> FilterIndex:
    """The start gates' index, built once per worker per set of rules."""
    key = tuple(rule.fingerprint for rule in rules)
    index = _indexes.get(key)
    if index is None:
        if len(_indexes) > 1_000:
            _indexes.clear()
        index = _indexes[key] = FilterIndex([rule.gate for rule in rules])
    return index


class PatternMatcher(KeyedProcessor):
    """Runs rules per key (see the module documentation)."""

    def __init__(
        self,
        *,
        event_time: str,
        rules: Sequence[Mapping[str, Any] | RuleSpec] = (),
        version: int | None = None,
        timestamps: tuple[str, ...] = (),
    ) -> None:
        """``rules`` fixed in the spec, or (``version`` set) a rule-set version's: then
        rows carry ``version`` and ``values``, and events are kept whole."""
        self.event_time = event_time
        self.timestamps = frozenset(timestamps)
        self.version = version
        self.rules = [compiled_rule(r) for r in rules]
        self.index = filter_index(self.rules)
        self.kept: frozenset[str] | None = None
        if version is None:
            needed = {event_time}
            for rule in self.rules:
                needed |= rule.fields
            self.kept = frozenset(needed)

    # -- state ---------------------------------------------------------------------------
    def init(self, state: StateDeclarations) -> None:
        self.state = state.value("cep", "binary")

    def _load(self) -> tuple[dict[str, NFAState], list[list[Any]], int]:
        """Each rule's NFA state (kept when its fingerprint is unchanged), the buffer
        and the arrival counter."""
        blob = self.state.get()
        data: dict[str, Any] = (
            orjson.loads(blob) if blob else {"rules": {}, "buffer": [], "arrivals": 0}
        )
        states: dict[str, NFAState] = {}
        for rule in self.rules:
            saved = data["rules"].get(rule.spec.name)
            st = _carried(saved, rule) if saved is not None else None
            if st is None:
                st = rule.nfa.initial_state()
            else:
                for _, event in st.events.values():
                    self._restore_times(event)
            states[rule.spec.name] = st
        buffer = data["buffer"]
        for entry in buffer:
            self._restore_times(entry[2])
        return states, buffer, int(data["arrivals"])

    def _restore_times(self, event: dict[str, Any]) -> None:
        for name in self.timestamps & event.keys():
            value = event[name]
            if isinstance(value, str):
                event[name] = datetime.fromisoformat(value)

    def _save(self, states: dict[str, NFAState], buffer: list[list[Any]], arrivals: int) -> None:
        live = {
            rule.spec.name: {**rule.prints, "nfa": states[rule.spec.name].to_json()}
            for rule in self.rules
            if _busy(states[rule.spec.name])
        }
        if not buffer and not live:
            self.state.clear()
            return
        data = {"rules": live, "buffer": buffer, "arrivals": arrivals}
        self.state.set(orjson.dumps(data, default=_encode))

    # -- calls ---------------------------------------------------------------------------
    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        states, buffer, arrivals = self._load()
        watermark = _ms(ctx.watermark) if ctx.watermark is not None else None
        times = self.timestamps
        for row in rows:
            ts = _ms(row.get(self.event_time))
            if ts is None:
                ctx.reject(row, f"pattern: no event time in {self.event_time!r}")
                continue
            if watermark is not None and ts <= watermark:
                ctx.reject(
                    row,
                    f"pattern: event time {_datetime(ts).isoformat()} is not after the "
                    f"watermark {_datetime(watermark).isoformat()} (late)",
                )
                continue
            if not self.rules:
                continue
            kept = (
                {k: v for k, v in row.items() if not k.startswith("_")}
                if self.kept is None
                else {k: row.get(k) for k in self.kept}
            )
            for name in times & kept.keys():
                # a plain datetime: JSON-encoded natively, not through _encode
                to_plain = getattr(kept[name], "to_pydatetime", None)
                if to_plain is not None:
                    kept[name] = to_plain()
            buffer.append([ts, arrivals, kept])
            arrivals += 1
        self._schedule(states, buffer, ctx)
        self._save(states, buffer, arrivals)
        return iter(())

    def on_timer(self, key: Any, timer: datetime, ctx: Context) -> Iterator[Record]:
        watermark = _ms(ctx.watermark) if ctx.watermark is not None else _ms(timer)
        assert watermark is not None
        states, buffer, arrivals = self._load()
        due = sorted((e for e in buffer if e[0] <= watermark), key=lambda e: (e[0], e[1]))
        out = self._run([states[rule.spec.name] for rule in self.rules], due, watermark)
        buffer = [e for e in buffer if e[0] > watermark]
        self._schedule(states, buffer, ctx)
        self._save(states, buffer, arrivals)
        return iter(out)

    def _run(self, states: list[NFAState], due: list[list[Any]], watermark: int) -> list[Record]:
        """Feed ``due`` events to the rules in event-time order, then move their time
        to the watermark; the rows of their matches and time-outs. An event goes only
        to the rules it can change: those with a match open (unless their NFA says it
        changes nothing) and the idle ones whose start gate it passes (the filter
        index finds them without asking each rule)."""
        rows: list[Record] = []
        rules = self.rules
        busy = {i for i, st in enumerate(states) if not _idle(st)}
        starts = self.index.starts
        gated = [rule.gate is not None for rule in rules]
        for ts, _, event in due:
            admitted = starts(event)
            if busy:
                todo = sorted(busy.union(admitted))
            elif admitted:
                todo = admitted
            else:
                continue  # starts nothing, and nothing is open
            for i in todo:
                st = states[i]
                nfa = rules[i].nfa
                if i in busy and nfa.unchanged_by(
                    st, event, start_unchanged=gated[i] and i not in admitted
                ):
                    continue
                self._emit(rules[i], nfa.advance_time(st, ts), rows)
                rows.extend(self._row(rules[i], m) for m in nfa.process(st, dict(event), ts))
                if _idle(st):
                    busy.discard(i)
                else:
                    busy.add(i)
        for rule, st in zip(rules, states, strict=True):
            self._emit(rule, rule.nfa.advance_time(st, watermark), rows)
        return rows

    def _emit(
        self, rule: CompiledRule, done: tuple[list[Match], list[Match]], rows: list[Record]
    ) -> None:
        matches, timed_out = done
        rows.extend(self._row(rule, m) for m in matches)
        if rule.spec.timeouts:
            rows.extend(self._row(rule, m) for m in timed_out)

    def _schedule(self, states: dict[str, NFAState], buffer: list[list[Any]], ctx: Context) -> None:
        """A timer at the earliest buffered event and at the earliest ``within``
        deadline: when the watermark passes either, there is work to do."""
        wanted: set[int] = set()
        if buffer:
            wanted.add(min(e[0] for e in buffer))
        for rule in self.rules:
            window = rule.nfa.window
            starts = [p.start_ts for p in states[rule.spec.name].partials if p.start is not None]
            if window and starts:
                wanted.add(min(starts) + window)
        if not wanted:
            return
        have = {_ms(t) for t in ctx.timers.list()}
        for when in wanted - have:
            ctx.timers.register(_datetime(when))

    def _row(self, rule: CompiledRule, match: Match) -> Record:
        events = [e for stage in match.stages.values() for e in stage]
        last = max(events, key=lambda e: _ms(e.get(self.event_time)) or 0) if events else {}
        row: Record = {
            "rule": rule.spec.name,
            "match_start": _datetime(match.start_ts),
            "match_end": _datetime(match.end_ts),
            "timed_out": match.timed_out_at is not None,
        }
        values = {}
        for name, compiled in rule.select.items():
            value = compiled.evaluate(last, match.stages)
            if isinstance(value, list):
                value = orjson.dumps(value, default=_encode).decode()
            values[name] = value
        if self.version is not None:
            row["version"] = self.version
            row["values"] = orjson.dumps(values, default=_encode).decode()
        else:
            row.update(values)
        return row


def _carried(saved: Mapping[str, Any], rule: CompiledRule) -> NFAState | None:
    """The rule's saved NFA state, if it still means the same: the rule is unchanged,
    or only its selections changed or stages were appended after a plain last stage
    (with the same ``within`` and skip strategy), and no completed match waits to be
    emitted under the old definition. None: the rule starts again."""
    st = NFAState.from_json(saved["nfa"])
    if saved["fp"] == rule.fingerprint:
        return st
    old = tuple(saved.get("stages") or ())
    new = tuple(rule.prints["stages"])
    if not old or saved.get("frame") != rule.prints["frame"] or new[: len(old)] != old:
        return None
    if len(old) < len(new) and not saved.get("extendable"):
        return None
    states = rule.nfa.states
    if st.completed or any(states.get(p.state) is None for p in st.partials):
        return None
    if any(states[p.state].kind == "final" for p in st.partials):
        return None
    return st


def _idle(st: NFAState) -> bool:
    """Only the start state: an event that passes no start gate changes nothing."""
    partials = st.partials
    return len(partials) == 1 and partials[0].start is None and not st.completed


def _busy(st: NFAState) -> bool:
    return bool(st.completed) or st.open_matches > 0
