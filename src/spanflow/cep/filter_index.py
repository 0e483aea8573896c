"""Which of many rules an event may start: an index over the rules' start gates, so
an event that starts none costs a lookup rather than one call per rule.

A gate of the form ``field op number`` (``> >= < <=``), the commonest, is indexed:
the rules comparing one field with one operator are kept sorted by their number and
an event's value finds every rule it passes with one bisection (the way Esper's
filter service indexes many statements' filters). Other gates are called one by one.
Either way the answer is what calling every gate would give: NULL, or a value that
is not a number, passes no indexed gate (a non-number is checked by calling).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from spanflow.spec.expressions import Compiled

_NO_STAGES: dict[str, list[Any]] = {}


class _Ordered:
    """The rules comparing one field with one operator, sorted by their number."""

    def __init__(self, op: str, entries: list[tuple[float, int, Compiled]]) -> None:
        entries.sort(key=lambda e: e[0])
        self.op = op
        self.bounds = [bound for bound, _, _ in entries]
        self.rules = [i for _, i, _ in entries]
        self.gates = [gate for _, _, gate in entries]

    def passing(self, value: Any) -> Sequence[int]:
        if isinstance(value, bool) or not isinstance(value, int | float):
            # not a number: what the gates make of it
            return [i for i, g in zip(self.rules, self.gates, strict=True) if _holds(g, value)]
        if value != value:  # NaN compares false with everything
            return ()
        op, bounds = self.op, self.bounds
        if op == ">":  # bound < value
            return self.rules[: bisect_left(bounds, value)]
        if op == ">=":  # bound <= value
            return self.rules[: bisect_right(bounds, value)]
        if op == "<":  # bound > value
            return self.rules[bisect_right(bounds, value) :]
        return self.rules[bisect_left(bounds, value) :]  # "<=": bound >= value


def _holds(gate: Compiled, value: Any) -> bool:
    assert gate.comparison is not None
    return gate.fn({gate.comparison[0]: value}, _NO_STAGES) is True


class FilterIndex:
    """Rules by position; ``None`` for a rule whose gate is missing (any event may
    start it)."""

    def __init__(self, gates: Sequence[Compiled | None]) -> None:
        grouped: dict[tuple[str, str], list[tuple[float, int, Compiled]]] = {}
        self.called: list[tuple[int, Compiled]] = []
        self.always: list[int] = []
        for i, gate in enumerate(gates):
            if gate is None:
                self.always.append(i)
            elif gate.comparison is None:
                self.called.append((i, gate))
            else:
                name, op, bound = gate.comparison
                grouped.setdefault((name, op), []).append((bound, i, gate))
        self.ordered = [(name, _Ordered(op, entries)) for (name, op), entries in grouped.items()]

    def starts(self, event: Mapping[str, Any]) -> list[int]:
        """The positions of the rules whose gate ``event`` passes, in order."""
        out: list[int] = list(self.always)
        for name, ordered in self.ordered:
            value = event.get(name)
            if value is not None:
                out.extend(ordered.passing(value))
        for i, gate in self.called:
            if gate.fn(event, _NO_STAGES) is True:
                out.append(i)
        if len(self.ordered) + len(self.called) > 1 or self.always:
            out.sort()
        return out
