"""Feed events to the pure NFA the way FlinkCEP's tests do (advance time, then the
event), and compare matches as FlinkCEP's ``compareMaps`` does: as a multiset of
matches, each the sorted ids of its events."""

from __future__ import annotations

from typing import Any

from spanflow.api.patterns import Pattern
from spanflow.cep.nfa import NFA, Match

Ev = tuple[int, str, float, int]
"""(id, name, price, timestamp): FlinkCEP's test Event and its record timestamp."""


def feed(
    pattern: Pattern, events: list[Ev], *, end: int | None = None
) -> tuple[list[Match], list[Match]]:
    """(matches, timed-out partial matches); ``end`` advances time after the last event."""
    nfa = NFA(pattern.spec())
    state = nfa.initial_state()
    matches: list[Match] = []
    timeouts: list[Match] = []
    for ident, name, price, ts in events:
        done, late = nfa.advance_time(state, ts)
        matches += done
        timeouts += late
        event: dict[str, Any] = {"id": ident, "name": name, "price": price}
        matches += nfa.process(state, event, ts)
    if end is not None:
        done, late = nfa.advance_time(state, end)
        matches += done
        timeouts += late
    return matches, timeouts


def ids(match: Match) -> tuple[int, ...]:
    return tuple(sorted(e["id"] for events in match.stages.values() for e in events))


def matched(pattern: Pattern, events: list[Ev], **kw: Any) -> list[tuple[int, ...]]:
    """Every match's sorted event ids, sorted: FlinkCEP's compareMaps."""
    return sorted(ids(m) for m in feed(pattern, events, **kw)[0])


def in_order(pattern: Pattern, events: list[Ev], **kw: Any) -> list[tuple[int, ...]]:
    """The matches in the order they were emitted (for skip strategies)."""
    return [ids(m) for m in feed(pattern, events, **kw)[0]]


def expect(matches: Any) -> list[tuple[int, ...]]:
    """Expected matches in the form :func:`matched` returns them."""
    return sorted(tuple(sorted(m)) for m in matches)
