"""Patterns compiled into a non-deterministic automaton, and the automaton's step
function: FlinkCEP's NFA, in pure Python, with its state as plain data.

Compilation follows FlinkCEP's ``NFACompiler`` state by state, so that matches are
the ones FlinkCEP finds: each stage becomes states with TAKE (consume the event,
move on), IGNORE (skip the event, stay) and PROCEED (an epsilon move, tested on the
same event) edges; contiguity decides the IGNORE edges (``next``: none,
``followed_by``: events the stage does not take, ``followed_by_any``: every event);
``times``/looping stages are chains of such states; ``not_next``/``not_followed_by``
become STOP states that discard a partial match; a trailing ``not_followed_by``
becomes a PENDING state that completes when ``within`` runs out (FlinkCEP 1.16+).

Where FlinkCEP keeps partial matches in a shared buffer addressed by Dewey numbers,
a :class:`Partial` here carries its own path — the (stage, event) pairs it took —
and events live once in :class:`NFAState` by sequence number. The matches are the
same; the state is small, JSON-able keyed state.

Events are fed in event-time order (the caller buffers until the watermark passes,
as FlinkCEP does): :meth:`NFA.advance_time` first (time-outs, pending matches),
then :meth:`NFA.process` for each event with that time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from spanflow.spec.expressions import Compiled, compile_expression
from spanflow.spec.patterns import PatternSpec, StageSpec, visible_stages

Event = Mapping[str, Any]
Action = Literal["take", "ignore", "proceed"]
Kind = Literal["start", "normal", "final", "stop", "pending"]
END = "$end$"


class _Context:
    """What a condition sees besides the event: the events each stage of the partial
    match took so far, built only when a condition asks (most do not)."""

    __slots__ = ("_matched", "partial", "state")

    def __init__(self, state: NFAState, partial: Partial) -> None:
        self.state = state
        self.partial = partial
        self._matched: dict[str, list[Event]] | None = None

    @property
    def matched(self) -> dict[str, list[Event]]:
        if self._matched is None:
            self._matched = self.state.materialize(self.partial.path)
        return self._matched


class Condition:
    """A transition's condition. One that reads only the event (not what stages
    matched) is ``plain``: it is evaluated once per event however many partial
    matches ask (:meth:`NFA.process` keeps a per-event cache)."""

    __slots__ = ("expression", "fn", "negates", "plain")

    def __init__(
        self,
        fn: Callable[[Event, Any], bool],
        plain: bool,
        negates: Condition | None = None,
        expression: Callable[[Event, Any], Any] | None = None,
    ) -> None:
        self.fn = fn
        """Called with the event and a :class:`_Context` (None for a plain condition)."""
        self.plain = plain
        self.negates = negates
        """The condition this one is the negation of, if it is."""
        self.expression = expression
        """A plain condition's compiled expression (it holds when that is True)."""

    def holds(self, event: Event, ctx: _Context, cache: dict[int, bool]) -> bool:
        if not self.plain:
            return self.fn(event, ctx)
        key = id(self)
        value = cache.get(key)
        if value is None:
            value = cache[key] = self.fn(event, ctx)
        return value


_TRUE = Condition(lambda e, x: True, True)


def _not(c: Condition) -> Condition:
    fn = c.fn
    return Condition(lambda e, x: not fn(e, x), c.plain, negates=c)


def _and(a: Condition, b: Condition) -> Condition:
    fa, fb = a.fn, b.fn
    return Condition(lambda e, x: fa(e, x) and fb(e, x), a.plain and b.plain)


def _or(a: Condition, b: Condition) -> Condition:
    fa, fb = a.fn, b.fn
    return Condition(lambda e, x: fa(e, x) or fb(e, x), a.plain and b.plain)


_EMPTY: dict[str, list[Event]] = {}


def _from_expression(compiled: Compiled) -> Condition:
    fn = compiled.fn
    if compiled.stages:
        return Condition(lambda e, x: fn(e, x.matched) is True, False)
    return Condition(lambda e, x: fn(e, _EMPTY) is True, True, expression=fn)


@dataclass(eq=False, repr=False)  # edges point back to states: no recursive repr
class State:
    name: str
    stage: str
    kind: Kind = "normal"
    edges: list[Edge] = field(default_factory=list)

    def add(self, action: Action, target: State | None, condition: Condition | None) -> None:
        self.edges.append(Edge(action, self, target or self, condition))


@dataclass(frozen=True, eq=False)
class Edge:
    action: Action
    source: State
    target: State
    condition: Condition | None


@dataclass(frozen=True, slots=True)
class Partial:
    """A partial match: where it is in the NFA and what it took, as (stage, event seq)
    pairs. ``start`` is its first event's sequence number (None: the start state)."""

    state: str
    path: tuple[tuple[str, int], ...] = ()
    start: int | None = None
    start_ts: int = 0

    def to_json(self) -> list[Any]:
        return [self.state, [list(p) for p in self.path], self.start, self.start_ts]

    @staticmethod
    def from_json(data: Sequence[Any]) -> Partial:
        path = tuple((str(s), int(q)) for s, q in data[1])
        return Partial(str(data[0]), path, data[2], int(data[3]))


@dataclass
class NFAState:
    """One key's automaton state: open partial matches, completed matches waiting for
    earlier partial matches (skip strategies), and the events they refer to."""

    partials: list[Partial]
    completed: list[Partial] = field(default_factory=list)
    events: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    """seq → (timestamp ms, event)."""
    next_seq: int = 0

    def materialize(self, path: Sequence[tuple[str, int]]) -> dict[str, list[Event]]:
        out: dict[str, list[Event]] = {}
        for stage, seq in path:
            out.setdefault(stage, []).append(self.events[seq][1])
        return out

    def compact(self) -> None:
        """Forget events no partial or completed match refers to."""
        used = {q for p in (*self.partials, *self.completed) for _, q in p.path}
        for seq in [q for q in self.events if q not in used]:
            del self.events[seq]

    @property
    def open_matches(self) -> int:
        return sum(1 for p in self.partials if p.start is not None)

    def to_json(self) -> dict[str, Any]:
        return {
            "partials": [p.to_json() for p in self.partials],
            "completed": [p.to_json() for p in self.completed],
            "events": [[seq, ts, ev] for seq, (ts, ev) in self.events.items()],
            "next_seq": self.next_seq,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> NFAState:
        return NFAState(
            partials=[Partial.from_json(p) for p in data["partials"]],
            completed=[Partial.from_json(p) for p in data["completed"]],
            events={int(seq): (int(ts), ev) for seq, ts, ev in data["events"]},
            next_seq=int(data["next_seq"]),
        )


@dataclass(frozen=True)
class Match:
    """A match (or a timed-out partial match): the events per stage, in order."""

    stages: dict[str, list[Event]]
    start_ts: int
    end_ts: int
    path: tuple[tuple[str, int], ...]
    """(stage, event sequence number) in the order the events were taken."""
    timed_out_at: int | None = None

    @property
    def sequence(self) -> tuple[int, ...]:
        return tuple(q for _, q in self.path)


def _order(p: Partial) -> tuple[bool, int]:
    """FlinkCEP's order of partial matches: by first event; the start state last."""
    return (p.start is None, p.start if p.start is not None else 0)


class NFA:
    """A compiled pattern. Stateless itself: every call takes the key's
    :class:`NFAState`, so one NFA serves every key."""

    def __init__(self, pattern: PatternSpec) -> None:
        self.pattern = pattern
        self.window = round(pattern.within * 1000) if pattern.within else 0
        self.states: dict[str, State] = {}
        self.start = _Compiler(self).compile()
        self._quiet = {name: _quiet_check(state) for name, state in self.states.items()}

    def initial_state(self) -> NFAState:
        return NFAState([Partial(self.start.name)])

    def kind(self, partial: Partial) -> Kind:
        return self.states[partial.state].kind

    # -- time ---------------------------------------------------------------------------
    def advance_time(self, st: NFAState, timestamp: int) -> tuple[list[Match], list[Match]]:
        """No event earlier than ``timestamp`` (ms) will come: partial matches older
        than ``within`` time out; pending ones (a trailing not_followed_by) match.
        Returns (matches, timed-out partial matches)."""
        if not self.window or (len(st.partials) == 1 and st.partials[0].start is None):
            return [], []
        timed_out: list[Match] = []
        keep: list[Partial] = []
        pending: list[Partial] = []
        for p in st.partials:
            if p.start is not None and timestamp - p.start_ts >= self.window:
                if self.kind(p) == "pending":
                    pending.append(p)
                else:
                    timed_out.append(self._match(st, p, timed_out_at=p.start_ts + self.window))
                continue
            keep.append(p)
        matches: list[Match] = []
        if pending or timed_out:
            self._emit(st, pending, keep, matches)
            st.partials = keep
            st.compact()
        return matches, timed_out

    # -- events ---------------------------------------------------------------------------
    def unchanged_by(self, st: NFAState, event: Event, *, start_unchanged: bool = False) -> bool:
        """Whether feeding ``event`` would leave ``st`` as it is — every partial match
        waits in place and none starts — so the caller may skip it. Only decided for
        states whose conditions read the event alone; False when unsure. Skipping
        also defers time-outs to the next event fed or :meth:`advance_time`, which
        emits the same rows: a partial match an event does not touch is the same
        before and after it. ``start_unchanged``: the caller knows the event starts
        no match (it failed the pattern's start gate)."""
        if st.completed:
            return False
        quiet = self._quiet
        last = ""
        for p in st.partials:
            if p.state == last or (start_unchanged and p.start is None):
                continue  # partial matches waiting at one state: one check
            last = p.state
            check = quiet[last]
            if check is None or not check(event):
                return False
        return True

    def process(self, st: NFAState, event: dict[str, Any], timestamp: int) -> list[Match]:
        """Feed one event (in event-time order); the matches it completes."""
        seq = st.next_seq
        st.next_seq += 1
        partials = st.partials
        if len(partials) == 1 and partials[0].start is None and not st.completed:
            # Nothing open: most events of most keys stop here, at the start state.
            only = partials[0]
            if not self._decision_graph(self.start, event, _Context(st, only), {}):
                return []
        st.events[seq] = (timestamp, event)
        keep: list[Partial] = []
        potential: list[Partial] = []
        dropped = False  # a partial match ended: the events only it held can go
        taken = False
        cache: dict[int, bool] = {}
        states = self.states
        for p in st.partials:
            retain: list[Partial] = []
            discard = False
            for q in self._next(st, p, event, seq, timestamp, cache):
                kind = states[q.state].kind
                if kind == "final":
                    potential.append(q)
                elif kind == "stop":
                    discard = True
                else:
                    retain.append(q)
                    taken = taken or bool(q.path and q.path[-1][1] == seq)
            if not discard:
                keep.extend(retain)
            dropped = dropped or discard or not retain
        # Successors keep their partial match's start and the start state stays last,
        # so ``keep`` is in FlinkCEP's order already.
        matches: list[Match] = []
        if potential:
            potential.sort(key=_order)
            if self.pattern.skip == "no_skip":
                matches = [self._match(st, m) for m in potential]
            else:
                self._emit(st, potential, keep, matches)
        elif st.completed:
            self._emit(st, [], keep, matches)
        st.partials = keep
        if dropped or potential:
            st.compact()
        elif not taken:
            del st.events[seq]  # no partial match took it
        return matches

    def _next(
        self, st: NFAState, p: Partial, event: Event, seq: int, ts: int, cache: dict[int, bool]
    ) -> list[Partial]:
        ctx = _Context(st, p)
        state = self.states[p.state]
        is_start = state.kind == "start"
        out: list[Partial] = []
        for edge in self._decision_graph(state, event, ctx, cache):
            if edge.action == "ignore":
                if not is_start:
                    target = edge.target.name
                    same = target == p.state  # the commonest case: wait in place
                    out.append(p if same else Partial(target, p.path, p.start, p.start_ts))
            else:  # take
                path = (*p.path, (edge.source.stage, seq))
                start, start_ts = (seq, ts) if is_start else (p.start, p.start_ts)
                out.append(Partial(edge.target.name, path, start, start_ts))
                final = self._final_after_proceed(edge.target, event, ctx, cache)
                if final is not None:
                    out.append(Partial(final.name, path, start, start_ts))
        if is_start:
            out.append(p)
        return out

    def _decision_graph(
        self, state: State, event: Event, ctx: _Context, cache: dict[int, bool]
    ) -> list[Edge]:
        out: list[Edge] = []
        stack = [state]
        while stack:
            current = stack.pop()
            for edge in current.edges:
                condition = edge.condition
                if condition is None or condition.holds(event, ctx, cache):
                    if edge.action == "proceed":
                        stack.append(edge.target)
                    else:
                        out.append(edge)
        return out

    def _final_after_proceed(
        self, state: State, event: Event, ctx: _Context, cache: dict[int, bool]
    ) -> State | None:
        stack = [state]
        while stack:
            current = stack.pop()
            for edge in current.edges:
                condition = edge.condition
                if edge.action == "proceed" and (
                    condition is None or condition.holds(event, ctx, cache)
                ):
                    if edge.target.kind == "final":
                        return edge.target
                    stack.append(edge.target)
        return None

    # -- matches and skip strategies ----------------------------------------------------------
    def _emit(
        self, st: NFAState, potential: list[Partial], partials: list[Partial], out: list[Match]
    ) -> None:
        """FlinkCEP's processMatchesAccordingToSkipStrategy: a completed match is emitted
        once no partial match that started before it is open; each emitted match
        prunes the partial and completed matches its skip strategy rules out."""
        st.completed = sorted([*st.completed, *potential], key=_order)
        while st.completed:
            earliest = st.completed[0]
            first_open = next((p for p in partials if p.start is not None), None)
            if first_open is not None and _order(earliest) > _order(first_open):
                break
            st.completed.pop(0)
            match = self._match(st, earliest)
            pruning = self._pruning_id(match)
            if pruning is not None:
                strict = self.pattern.skip in ("skip_to_first", "skip_to_last")
                partials[:] = [p for p in partials if not _pruned(p, pruning, strict)]
                st.completed = [p for p in st.completed if not _pruned(p, pruning, strict)]
            out.append(match)

    def _pruning_id(self, match: Match) -> int | None:
        skip = self.pattern.skip
        if skip == "skip_to_next":
            return min(match.sequence)
        if skip == "skip_past_last_event":
            return max(match.sequence)
        if skip in ("skip_to_first", "skip_to_last"):
            assert self.pattern.skip_stage is not None
            taken = [q for s, q in match.path if s == self.pattern.skip_stage]
            if not taken:
                return None
            return taken[0] if skip == "skip_to_first" else taken[-1]
        return None

    def _match(self, st: NFAState, p: Partial, timed_out_at: int | None = None) -> Match:
        stages = st.materialize(p.path)
        seqs = tuple(q for _, q in p.path)
        times = [st.events[q][0] for q in seqs]
        return Match(
            stages=stages,
            start_ts=min(times) if times else p.start_ts,
            end_ts=max(times) if times else p.start_ts,
            path=p.path,
            timed_out_at=timed_out_at,
        )


def _quiet_check(state: State) -> Callable[[Event], bool] | None:
    """For a state without proceed edges whose conditions read only the event: a check
    that an event moves no partial match waiting there (no take edge holds; a
    non-start state's one ignore edge loops back to it and holds)."""
    edges = state.edges
    if any(e.action == "proceed" or (e.condition and not e.condition.plain) for e in edges):
        return None
    takes = [e.condition for e in edges if e.action == "take"]
    ignores = [e for e in edges if e.action == "ignore"]
    if not takes or any(c is None for c in takes):
        return None
    conditions = [c for c in takes if c is not None]
    fns = [c.fn for c in conditions]
    if state.kind != "start":
        if state.kind != "normal" or len(ignores) != 1 or ignores[0].target is not state:
            return None
        stay = ignores[0].condition
        if stay is not None and not (stay.negates is not None and stay.negates in takes):
            # an ignore condition of its own (followed_by_any's is None: always)
            fns.append(_not(stay).fn)
    if len(fns) == 1:
        expression = conditions[0].expression if len(conditions) == 1 else None
        if expression is not None:  # the commonest: one call
            return lambda event: expression(event, _EMPTY) is not True
        only = fns[0]
        return lambda event: not only(event, None)
    return lambda event: not any(fn(event, None) for fn in fns)


def _pruned(p: Partial, pruning: int, strict: bool) -> bool:
    if p.start is None:
        return False
    return p.start < pruning if strict else p.start <= pruning


class _Compiler:
    """FlinkCEP's NFAFactoryCompiler, for patterns without groups: builds the states
    from the last stage back to the first."""

    def __init__(self, nfa: NFA) -> None:
        self.nfa = nfa
        self.stages = nfa.pattern.stages
        self.stop_states: dict[str, State] = {}
        self.names: dict[str, int] = {}
        self.index = len(self.stages) - 1  # the stage being converted
        self.following_take: Condition | None = None
        self.conditions: dict[str, Condition] = {}
        self.untils: dict[str, Condition] = {}
        self._compile_conditions()

    # -- conditions ---------------------------------------------------------------------------
    def _compile_conditions(self) -> None:
        pattern = self.nfa.pattern
        for i, stage in enumerate(self.stages):
            visible = visible_stages(pattern, i)
            self.conditions[stage.name] = _condition(stage.where, visible)
            if stage.until is not None:
                self.untils[stage.name] = _condition(stage.until, visible)

    @property
    def current(self) -> StageSpec:
        return self.stages[self.index]

    @property
    def previous(self) -> StageSpec | None:
        return self.stages[self.index - 1] if self.index > 0 else None

    @property
    def following(self) -> StageSpec | None:
        i = self.index + 1
        return self.stages[i] if i < len(self.stages) else None

    def take_condition(self, stage: StageSpec) -> Condition:
        return self.conditions[stage.name]

    # -- states -------------------------------------------------------------------------------
    def state(self, stage: str, kind: Kind = "normal") -> State:
        n = self.names.get(stage, 0)
        self.names[stage] = n + 1
        name = stage if n == 0 else f"{stage}:{n}"
        made = State(name, stage, kind)
        self.nfa.states[name] = made
        return made

    def compile(self) -> State:
        sink = self.state(END, "final")
        sink = self._middle_states(sink)
        start = self._convert(sink)
        start.kind = "start"
        return start

    def _middle_states(self, sink: State) -> State:
        last = sink
        while self.index > 0:
            stage = self.current
            if stage.contiguity == "not_followed_by":
                if self.nfa.window and last.kind == "final":
                    # A trailing not_followed_by: pending until within runs out.
                    pending = self.state(stage.name, "pending")
                    cond = self.take_condition(stage)
                    pending.add("proceed", self._stop_state(cond, stage.name), cond)
                    pending.add("ignore", None, _not(cond))
                    last = pending
                # else: folded into the edges of the stages before it (stop states)
            elif stage.contiguity == "not_next":
                not_next = self.state(stage.name)
                cond = self.take_condition(stage)
                stop = self._stop_state(cond, stage.name)
                if last.kind == "final":
                    not_next.add("ignore", last, _not(cond))  # the proceed to final must not fire
                else:
                    not_next.add("proceed", last, _not(cond))
                not_next.add("proceed", stop, cond)
                last = not_next
            else:
                last = self._convert(last)
            self.index -= 1
        return last

    def _not_conditions(self) -> list[tuple[Condition, str]]:
        """The not_followed_by stages that still guard the current one: the one just
        before it, and any before a run of optional stages."""
        out = []
        i = self.index
        while i > 0 and (
            self.stages[i - 1].optional or self.stages[i - 1].contiguity == "not_followed_by"
        ):
            i -= 1
            if self.stages[i].contiguity == "not_followed_by":
                out.append((self.take_condition(self.stages[i]), self.stages[i].name))
        return out

    def _stop_state(self, condition: Condition, name: str) -> State:
        stop = self.stop_states.get(name)
        if stop is None:
            stop = self.state(name, "stop")
            stop.add("take", None, condition)
            self.stop_states[name] = stop
        return stop

    def _convert(self, sink: State) -> State:
        stage = self.current
        if stage.looping:
            looping = self._looping(self._copy_without_transitive_nots(sink))
            last = self._times(looping, sink, stage.bounds[0], stage.bounds[0])
        elif stage.times is not None:
            last = self._times(sink, sink, *stage.times)
        else:
            last = self._singleton(
                sink,
                sink,
                self.take_condition(stage),
                self._ignore_condition(stage, stage.contiguity),
                stage.optional,
            )
        self._add_stop_states(last)
        return last

    def _copy_without_transitive_nots(self, sink: State) -> State:
        """For an optional stage: a copy of ``sink`` whose proceed edges no longer lead
        to the stop states of earlier not_followed_by stages (taking an event here
        ends their guard)."""
        nots = self._not_conditions()
        if not nots or not self.current.optional:
            return sink
        names = {name for _, name in nots}
        copy = self.state(sink.stage, sink.kind)
        for edge in sink.edges:
            if edge.action == "proceed":
                target = edge.target
                if target.kind == "stop":
                    if target.stage in names:
                        continue
                else:
                    target = self._copy_without_transitive_nots(target)
                copy.edges.append(Edge("proceed", copy, target, edge.condition))
            else:
                target = copy if edge.target is edge.source else edge.target
                copy.edges.append(Edge(edge.action, copy, target, edge.condition))
        return copy

    def _add_stop_states(self, state: State) -> None:
        for condition, name in self._not_conditions():
            state.add("proceed", self._stop_state(condition, name), condition)

    def _add_stop_state_to_looping(self, state: State) -> None:
        following = self.following
        if following is not None and following.contiguity == "not_followed_by":
            cond = self.take_condition(following)
            state.add("proceed", self._stop_state(cond, following.name), cond)

    def _times(self, sink: State, proceed: State, low: int, high: int) -> State:
        stage = self.current
        until = self.untils.get(stage.name)
        inner_ignore = _with_until(self._inner_ignore_condition(stage), until, take=False)
        take = _with_until(self.take_condition(stage), until, take=True)
        assert take is not None
        last = sink
        for _ in range(low, high):
            last = self._singleton(last, proceed, take, inner_ignore, True)
            self._add_stop_state_to_looping(last)
        for _ in range(low - 1):
            last = self._singleton(last, None, take, inner_ignore, False)
            self._add_stop_state_to_looping(last)
        return self._singleton(
            last, proceed, take, self._ignore_condition(stage, stage.contiguity), stage.optional
        )

    def _singleton(
        self,
        sink: State,
        proceed: State | None,
        take: Condition,
        ignore: Condition | None,
        optional: bool,
    ) -> State:
        stage = self.current
        single = self.state(stage.name)
        target = self._copy_without_transitive_nots(sink)
        single.add("take", target, take)
        proceed_condition: Condition = _TRUE
        if optional:
            if stage.greedy:
                proceed_condition = self._greedy_condition(take, ignore)
            assert proceed is not None
            single.add("proceed", proceed, proceed_condition)
        if ignore is not None:
            if optional:
                ignore_state = self.state(stage.name)
                ignore_state.add("take", target, take)
                ignore_state.add("ignore", None, ignore)
                self._add_stop_states(ignore_state)
                if stage.greedy:
                    assert proceed is not None
                    ignore_state.add("proceed", proceed, proceed_condition)
            else:
                ignore_state = single
            single.add("ignore", ignore_state, ignore)
        self.following_take = self._following_take(take, optional)
        return single

    def _looping(self, sink: State) -> State:
        stage = self.current
        until = self.untils.get(stage.name)
        ignore = _with_until(self._inner_ignore_condition(stage), until, take=False)
        take = _with_until(self.take_condition(stage), until, take=True)
        assert take is not None
        proceed_condition: Condition = _TRUE
        if stage.greedy:
            proceed_condition = self._greedy_condition(take, ignore)
        looping = self.state(stage.name)
        looping.add("proceed", sink, proceed_condition)
        looping.add("take", None, take)
        self._add_stop_state_to_looping(looping)
        if ignore is not None:
            ignore_state = self.state(stage.name)
            ignore_state.add("take", looping, take)
            ignore_state.add("ignore", None, ignore)
            looping.add("ignore", ignore_state, ignore)
            if stage.greedy:
                ignore_state.add("proceed", sink, proceed_condition)
            self._add_stop_state_to_looping(ignore_state)
        self.following_take = self._following_take(take, True)
        return looping

    def _greedy_condition(self, take: Condition, ignore: Condition | None) -> Condition:
        greedy = _and(_TRUE, _not(take))
        if self.following_take is not None:
            greedy = _and(greedy, self.following_take)
        if ignore is not None:
            return _or(greedy, _not(_or(take, ignore)))
        return _or(greedy, _not(take))

    def _following_take(self, take: Condition, optional: bool) -> Condition:
        if optional and self.following_take is not None:
            return _or(take, self.following_take)
        return take

    def _inner_ignore_condition(self, stage: StageSpec) -> Condition | None:
        return _ignore_for(stage.inner, self.take_condition(stage))

    def _ignore_condition(self, stage: StageSpec, contiguity: str) -> Condition | None:
        strategy = {"begin": "strict", "next": "strict", "followed_by": "relaxed"}.get(
            contiguity, "any"
        )
        return _ignore_for(strategy, self.take_condition(stage))


def _condition(text: str | None, visible: set[str]) -> Condition:
    """A stage's condition (validated with the pattern: see spanflow.spec.patterns)."""
    if text is None:
        return _TRUE
    return _from_expression(compile_expression(text, stages=visible))


def _ignore_for(strategy: str, take: Condition) -> Condition | None:
    if strategy == "strict":
        return None
    if strategy == "relaxed":
        return _not(take)
    return _TRUE


def _with_until(
    condition: Condition | None, until: Condition | None, *, take: bool
) -> Condition | None:
    if until is not None and condition is not None:
        return _and(_not(until), condition)
    if until is not None and take:
        return _not(until)
    return condition
