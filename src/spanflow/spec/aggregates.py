"""Aggregate expressions as users write them: ``count``, ``sum(f)``, ``avg(f)``,
``min(f)``, ``max(f)``; and how each splits into mergeable partials."""

from __future__ import annotations

import re

AGGREGATE = re.compile(r"^\s*(count|sum|avg|mean|min|max)\s*(?:\(\s*([A-Za-z_]\w*|\*)?\s*\))?\s*$")
AGGREGATE_FUNCTIONS = ("count", "sum", "avg", "min", "max")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")


def parse_aggregate(text: str) -> tuple[str, str | None]:
    """``"avg(temperature)"`` → ``("avg", "temperature")``; ``"count"`` → ``("count", None)``."""
    match = AGGREGATE.match(text)
    if not match:
        raise ValueError(f"aggregate {text!r} is not one of count, sum(f), avg(f), min(f), max(f)")
    fn, field = match.group(1), match.group(2)
    fn = "avg" if fn == "mean" else fn
    if field == "*":
        field = None
    if fn != "count" and field is None:
        raise ValueError(f"aggregate {text!r} needs a field, e.g. {fn}(temperature)")
    return fn, field


def check_aggregates(aggregates: dict[str, str]) -> None:
    """Raise ValueError naming the first bad output name or expression."""
    for name, text in aggregates.items():
        if not IDENTIFIER.match(name):
            raise ValueError(f"aggregate name {name!r} must be an identifier")
        parse_aggregate(text)


def partial_columns(name: str, text: str) -> dict[str, str]:
    """The columns a partial aggregate emits for one aggregate, and how the merge folds each.

    ``avg`` travels as a sum and a count so that the merge is exact.

    >>> partial_columns("t", "avg(temp)")
    {'t__sum': 'sum', 't__count': 'sum'}
    >>> partial_columns("n", "count")
    {'n': 'sum'}
    """
    fn, _ = parse_aggregate(text)
    if fn == "avg":
        return {f"{name}__sum": "sum", f"{name}__count": "sum"}
    return {name: {"count": "sum", "sum": "sum", "min": "min", "max": "max"}[fn]}
