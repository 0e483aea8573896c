"""Spark SQL expressions over one event and the events a partial match holds, evaluated
in Python: the conditions and selections of event patterns.

A pattern's conditions must run inside the NFA, record by record, with access to what
earlier stages matched (``price > first(hot.price)``, ``count(hot) < 5``) — Spark
cannot evaluate that per partial match. So the expressions are parsed as Spark SQL
(by sqlglot) and compiled into Python closures with SQL's semantics: three-valued
logic (a comparison with NULL is NULL, and a condition that is NULL does not hold),
integer and double arithmetic, division by zero giving NULL.

Names:

* ``temperature`` — a field of the event being tested (in a selection: of the
  match's last event);
* ``hot.temperature`` — the field of the first event stage ``hot`` matched (NULL
  when it matched none);
* ``first(hot.t)``, ``last(hot.t)``, ``min``, ``max``, ``sum``, ``avg``,
  ``count(hot)`` (events), ``count(hot.t)`` (non-NULL values), ``list(hot.t)``
  (selections only) — over the events stage ``hot`` matched so far. In a condition,
  the event being tested is not among them (FlinkCEP's ``getEventsForPattern``).

>>> c = compile_expression("price > first(hot.price) * 1.1 and count(hot) < 5",
...                        stages={"hot"})
>>> c.evaluate({"price": 12.0}, {"hot": [{"price": 10.0}, {"price": 11.0}]})
True
>>> c.evaluate({"price": None}, {"hot": [{"price": 10.0}]}) is None
True
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

Event = Mapping[str, Any]
Matched = Mapping[str, Sequence[Event]]
Fn = Callable[[Event, Matched], Any]

AGGREGATES = ("first", "last", "min", "max", "sum", "avg", "count", "list")


class ExpressionError(ValueError):
    """An expression cannot be parsed or uses what patterns do not support."""


@dataclass(frozen=True)
class Compiled:
    text: str
    fn: Fn
    stages: frozenset[str] = field(default_factory=frozenset)
    """The stages it reads."""
    fields: frozenset[str] = field(default_factory=frozenset)
    """The event fields it reads (unqualified and qualified)."""
    comparison: tuple[str, str, float] | None = None
    """(field, operator, number) when the whole expression is ``field op number`` with
    op one of ``> >= < <=``: what a filter index can decide without calling it."""

    def evaluate(self, event: Event, matched: Matched) -> Any:
        return self.fn(event, matched)

    def holds(self, event: Event, matched: Matched) -> bool:
        """As a condition: true only when the value is true (NULL does not hold)."""
        return self.fn(event, matched) is True


def compile_expression(
    text: str, *, stages: set[str] | frozenset[str] = frozenset(), selection: bool = False
) -> Compiled:
    """Compile ``text``; ``stages`` are the names it may qualify fields with.
    ``selection`` allows ``list(...)`` and makes unqualified fields the last event's."""
    tree = _parse(text, stages)
    if not isinstance(tree, exp.Expression):
        raise ExpressionError(f"{text!r} is not an expression")
    builder = _Builder(frozenset(stages), selection)
    fn = builder.build(tree)
    return Compiled(
        text,
        fn,
        frozenset(builder.stages_read),
        frozenset(builder.fields_read),
        _numeric_comparison(tree, stages),
    )


_ORDERING: dict[type[exp.Expression], str] = {
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
}


def _numeric_comparison(
    tree: exp.Expression, stages: set[str] | frozenset[str]
) -> tuple[str, str, float] | None:
    while isinstance(tree, exp.Paren):
        tree = tree.this
    op = _ORDERING.get(type(tree))
    column, literal = tree.this, tree.expression
    if op is None or not isinstance(column, exp.Column) or column.table:
        return None
    sign = 1
    if isinstance(literal, exp.Neg):
        sign, literal = -1, literal.this
    if not isinstance(literal, exp.Literal) or literal.is_string or column.name in stages:
        return None
    return column.name, op, sign * _literal(literal)


_QUOTED = re.compile(r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`)")


def _parse(text: str, stages: set[str] | frozenset[str]) -> exp.Expression:
    """Parse ``text`` with every stage name quoted as an identifier, so that a stage
    may be called ``drop`` or ``end`` (SQL keywords)."""
    quoted = text
    if stages:
        names = re.compile(r"\b(" + "|".join(re.escape(s) for s in sorted(stages)) + r")\b")
        parts = _QUOTED.split(text)
        quoted = "".join(
            part if i % 2 else names.sub(lambda m: f"`{m.group(1)}`", part)
            for i, part in enumerate(parts)
        )
    try:
        tree = sqlglot.parse_one(quoted, read="spark")
    except ParseError as exc:
        raise ExpressionError(f"{text!r} is not a SQL expression: {_first_line(exc)}") from None
    assert isinstance(tree, exp.Expression)
    return tree


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


# -- three-valued helpers ------------------------------------------------------------------
def _and(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: Any, b: Any) -> Any:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _null_safe(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        try:
            return op(a, b)
        except (TypeError, ValueError):
            return None

    return apply


def _divide(a: Any, b: Any) -> Any:
    return None if b == 0 else a / b


def _modulo(a: Any, b: Any) -> Any:
    return None if b == 0 else math.fmod(a, b) if isinstance(a, float) else a % b


_BINARY: dict[type[exp.Expression], Callable[[Any, Any], Any]] = {
    exp.EQ: _null_safe(operator.eq),
    exp.NEQ: _null_safe(operator.ne),
    exp.GT: _null_safe(operator.gt),
    exp.GTE: _null_safe(operator.ge),
    exp.LT: _null_safe(operator.lt),
    exp.LTE: _null_safe(operator.le),
    exp.Add: _null_safe(operator.add),
    exp.Sub: _null_safe(operator.sub),
    exp.Mul: _null_safe(operator.mul),
    exp.Div: _null_safe(_divide),
    exp.Mod: _null_safe(_modulo),
}


_COMPARE: dict[type[exp.Expression], Callable[[Any, Any], bool]] = {
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
    exp.LT: operator.lt,
    exp.LTE: operator.le,
}


def _like(pattern: str) -> re.Pattern[str]:
    out = []
    for ch in pattern:
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def _numeric(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def apply(v: Any) -> Any:
        if v is None:
            return None
        try:
            return fn(v)
        except (TypeError, ValueError):
            return None

    return apply


_SCALAR: dict[str, Callable[..., Any]] = {
    "abs": _numeric(abs),
    "sqrt": _numeric(lambda v: math.sqrt(v) if v >= 0 else None),
    "ln": _numeric(lambda v: math.log(v) if v > 0 else None),
    "exp": _numeric(math.exp),
    "floor": _numeric(math.floor),
    "ceil": _numeric(math.ceil),
    "lower": _numeric(lambda v: str(v).lower()),
    "upper": _numeric(lambda v: str(v).upper()),
    "length": _numeric(lambda v: len(str(v))),
}


class _Builder:
    def __init__(self, stages: frozenset[str], selection: bool) -> None:
        self.stages = stages
        self.selection = selection
        self.stages_read: set[str] = set()
        self.fields_read: set[str] = set()

    def build(self, node: exp.Expression) -> Fn:
        if isinstance(node, exp.Paren):
            return self.build(node.this)
        if isinstance(node, exp.Literal):
            value = _literal(node)
            return lambda e, m: value
        if isinstance(node, exp.Boolean):
            flag = bool(node.this)
            return lambda e, m: flag
        if isinstance(node, exp.Null):
            return lambda e, m: None
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, exp.Neg):
            inner = self.build(node.this)
            return lambda e, m: None if (v := inner(e, m)) is None else -v
        if isinstance(node, exp.Not):
            inner = self.build(node.this)
            return lambda e, m: None if (v := inner(e, m)) is None else not v
        if isinstance(node, exp.And):
            left, right = self.build(node.this), self.build(node.expression)
            return lambda e, m: _and(left(e, m), right(e, m))
        if isinstance(node, exp.Or):
            left, right = self.build(node.this), self.build(node.expression)
            return lambda e, m: _or(left(e, m), right(e, m))
        op = _BINARY.get(type(node))
        if op is not None:
            fast = self._field_against_literal(node)
            if fast is not None:
                return fast
            left, right = self.build(node.this), self.build(node.expression)
            return lambda e, m: op(left(e, m), right(e, m))
        if isinstance(node, exp.Is):
            inner = self.build(node.this)
            if not isinstance(node.expression, exp.Null):
                raise ExpressionError(f"'{node.sql()}': only IS [NOT] NULL is supported")
            return lambda e, m: inner(e, m) is None
        if isinstance(node, exp.Between):
            value, low, high = (
                self.build(node.this),
                self.build(node.args["low"]),
                self.build(node.args["high"]),
            )
            ge, le = _BINARY[exp.GTE], _BINARY[exp.LTE]
            return lambda e, m: _and(ge(value(e, m), low(e, m)), le(value(e, m), high(e, m)))
        if isinstance(node, exp.In):
            return self._in(node)
        if isinstance(node, exp.Like):
            return self._like(node)
        if isinstance(node, exp.Coalesce):
            parts = [self.build(node.this), *(self.build(x) for x in node.expressions)]
            return lambda e, m: next((v for p in parts if (v := p(e, m)) is not None), None)
        if isinstance(node, exp.Greatest | exp.Least):
            parts = [self.build(node.this), *(self.build(x) for x in node.expressions)]
            pick = max if isinstance(node, exp.Greatest) else min

            def extreme(e: Event, m: Matched) -> Any:
                values = [v for p in parts if (v := p(e, m)) is not None]
                return pick(values) if values else None

            return extreme
        if isinstance(node, exp.Round):
            inner = self.build(node.this)
            digits = int(_literal(node.args["decimals"])) if node.args.get("decimals") else 0
            return lambda e, m: None if (v := inner(e, m)) is None else round(v, digits)
        if isinstance(node, exp.Cast):
            return self._cast(node)
        if isinstance(node, exp.If):
            cond, then = self.build(node.this), self.build(node.args["true"])
            other = self.build(node.args["false"]) if node.args.get("false") else None
            return lambda e, m: (
                then(e, m) if cond(e, m) is True else (other(e, m) if other else None)
            )
        return self._function(node)

    # -- pieces ----------------------------------------------------------------------------
    def _field_against_literal(self, node: exp.Expression) -> Fn | None:
        """``temperature > 80``, the commonest condition, in one call (same result as
        the general path: NULL when the field is NULL or the types do not compare)."""
        field, literal = node.this, node.expression
        compare = _COMPARE.get(type(node))
        if compare is None or not isinstance(field, exp.Column) or field.table:
            return None
        if not isinstance(literal, exp.Literal) or field.name in self.stages:
            return None
        name, value = field.name, _literal(literal)
        self.fields_read.add(name)

        def check(e: Event, m: Matched) -> Any:
            v = e.get(name)
            if v is None:
                return None
            try:
                return compare(v, value)
            except TypeError:
                return None

        return check

    def _column(self, node: exp.Column) -> Fn:
        name = node.name
        table = node.table
        if not table:
            if name in self.stages and not self.selection:
                raise ExpressionError(
                    f"'{name}' is a stage: use count({name}) or an aggregate of its fields "
                    f"(e.g. last({name}.field))"
                )
            self.fields_read.add(name)
            return lambda e, m: e.get(name)
        self._check_stage(table, node.sql())
        self.fields_read.add(name)
        return lambda e, m: _first_field(m.get(table), name)

    def _check_stage(self, stage: str, where: str) -> None:
        if stage not in self.stages:
            known = ", ".join(sorted(self.stages)) or "none"
            raise ExpressionError(
                f"'{where}': no stage '{stage}' before this one (stages: {known})"
            )
        self.stages_read.add(stage)

    def _in(self, node: exp.In) -> Fn:
        value = self.build(node.this)
        options = [self.build(x) for x in node.expressions]
        if not options:
            raise ExpressionError(f"'{node.sql()}': IN needs a list of values")

        def member(e: Event, m: Matched) -> Any:
            v = value(e, m)
            if v is None:
                return None
            values = [o(e, m) for o in options]
            if v in values:
                return True
            return None if None in values else False

        return member

    def _like(self, node: exp.Like) -> Fn:
        value = self.build(node.this)
        if not isinstance(node.expression, exp.Literal):
            raise ExpressionError(f"'{node.sql()}': LIKE takes a string literal pattern")
        regex = _like(str(node.expression.this))
        return lambda e, m: None if (v := value(e, m)) is None else bool(regex.fullmatch(str(v)))

    def _cast(self, node: exp.Cast) -> Fn:
        inner = self.build(node.this)
        target = node.to.sql(dialect="spark").lower()
        convert: Callable[[Any], Any]
        if target in ("double", "float", "decimal"):
            convert = float
        elif target in ("int", "bigint", "long", "smallint", "tinyint", "integer"):
            convert = int
        elif target in ("string", "varchar"):
            convert = str
        elif target == "boolean":
            convert = bool
        else:
            raise ExpressionError(f"'{node.sql()}': cannot cast to {target} in a pattern")
        return lambda e, m: _numeric(convert)(inner(e, m))

    def _function(self, node: exp.Expression) -> Fn:
        name = _function_name(node)
        if name in AGGREGATES or name == "collect_list":
            return self._aggregate("list" if name == "collect_list" else name, node)
        scalar = _SCALAR.get(name)
        if scalar is not None:
            args = _arguments(node)
            if len(args) != 1:
                raise ExpressionError(f"'{node.sql()}': {name} takes one argument")
            inner = self.build(args[0])
            return lambda e, m: scalar(inner(e, m))
        raise ExpressionError(
            f"'{node.sql()}': {name or type(node).__name__} is not supported in patterns"
        )

    def _aggregate(self, name: str, node: exp.Expression) -> Fn:
        args = _arguments(node)
        if len(args) != 1:
            raise ExpressionError(f"'{node.sql()}': {name} takes one argument")
        arg = args[0]
        if name == "list" and not self.selection:
            raise ExpressionError(f"'{node.sql()}': list(...) is for selections, not conditions")
        if isinstance(arg, exp.Column) and not arg.table and arg.name in self.stages:
            stage = arg.name
            if name != "count":
                raise ExpressionError(
                    f"'{node.sql()}': {name} needs a field of stage {stage}, "
                    f"e.g. {name}({stage}.value)"
                )
            self._check_stage(stage, node.sql())
            return lambda e, m: len(m.get(stage) or ())
        if not isinstance(arg, exp.Column) or not arg.table:
            raise ExpressionError(
                f"'{node.sql()}': {name} takes a stage's field: {name}(stage.field)"
            )
        stage, column = arg.table, arg.name
        self._check_stage(stage, node.sql())
        self.fields_read.add(column)
        return _STAGE_AGGREGATES[name](stage, column)


def _function_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return ""


def _arguments(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    out = [node.this] if isinstance(node.this, exp.Expression) else []
    out += [x for x in node.expressions if isinstance(x, exp.Expression)]
    return out


def _literal(node: exp.Expression) -> Any:
    if not isinstance(node, exp.Literal):
        raise ExpressionError(f"'{node.sql()}' is not a literal")
    if node.is_string:
        return str(node.this)
    text = str(node.this)
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return float(text)


def _first_field(events: Sequence[Event] | None, name: str) -> Any:
    return events[0].get(name) if events else None


def _values(events: Sequence[Event] | None, name: str) -> list[Any]:
    return [v for ev in events or () if (v := ev.get(name)) is not None]


def _agg_first(stage: str, name: str) -> Fn:
    return lambda e, m: _first_field(m.get(stage), name)


def _agg_last(stage: str, name: str) -> Fn:
    def last(e: Event, m: Matched) -> Any:
        events = m.get(stage)
        return events[-1].get(name) if events else None

    return last


def _agg_over(pick: Callable[[list[Any]], Any]) -> Callable[[str, str], Fn]:
    def make(stage: str, name: str) -> Fn:
        def agg(e: Event, m: Matched) -> Any:
            values = _values(m.get(stage), name)
            return pick(values) if values else None

        return agg

    return make


def _agg_count(stage: str, name: str) -> Fn:
    return lambda e, m: len(_values(m.get(stage), name))


def _agg_list(stage: str, name: str) -> Fn:
    return lambda e, m: [ev.get(name) for ev in m.get(stage) or ()]


_STAGE_AGGREGATES: dict[str, Callable[[str, str], Fn]] = {
    "first": _agg_first,
    "last": _agg_last,
    "min": _agg_over(min),
    "max": _agg_over(max),
    "sum": _agg_over(sum),
    "avg": _agg_over(lambda vs: sum(vs) / len(vs)),
    "count": _agg_count,
    "list": _agg_list,
}


# -- result types (for a pattern's output schema) -----------------------------------------
_INTEGRAL = ("long", "int", "integer", "short", "byte")
_BOOLEAN_NODES = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or, exp.Not,
    exp.Is, exp.In, exp.Like, exp.Between, exp.Boolean,
)  # fmt: skip


def result_type(
    text: str, fields: Mapping[str, str], stages: set[str] | frozenset[str] = frozenset()
) -> str:
    """The spanflow type of a selection's value, given the stream's field types:
    ``count(hot)`` → long, ``max(hot.t)`` → t's type, ``avg`` → double, a comparison
    → boolean, ``list(...)`` → string (a JSON array). Unknown: double.

    >>> result_type("max(hot.t) - min(hot.t)", {"t": "double"})
    'double'
    >>> result_type("count(hot)", {})
    'long'
    """
    tree = _parse(text, stages)
    return _type_of(tree, {k: v.rstrip("?") for k, v in fields.items()})


def _type_of(node: exp.Expression, fields: Mapping[str, str]) -> str:
    if isinstance(node, exp.Paren):
        return _type_of(node.this, fields)
    if isinstance(node, _BOOLEAN_NODES):
        return "boolean"
    if isinstance(node, exp.Literal):
        return (
            "string"
            if node.is_string
            else ("long" if isinstance(_literal(node), int) else "double")
        )
    if isinstance(node, exp.Column):
        return fields.get(node.name, "double")
    name = _function_name(node)
    if name == "count" or name == "length":
        return "long"
    if name in ("list", "collect_list"):
        return "string"
    if name == "avg":
        return "double"
    if name in ("first", "last", "min", "max", "abs"):
        args = _arguments(node)
        return _type_of(args[0], fields) if args else "double"
    if name == "sum":
        args = _arguments(node)
        inner = _type_of(args[0], fields) if args else "double"
        return "long" if inner in _INTEGRAL else "double"
    if name in ("lower", "upper"):
        return "string"
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Mod):
        left, right = _type_of(node.this, fields), _type_of(node.expression, fields)
        return "long" if left in _INTEGRAL and right in _INTEGRAL else "double"
    if isinstance(node, exp.Cast):
        target = node.to.sql(dialect="spark").lower()
        return {"int": "long", "bigint": "long", "string": "string", "boolean": "boolean"}.get(
            target, "double"
        )
    if isinstance(node, exp.Coalesce | exp.If):
        return _type_of(node.this if isinstance(node, exp.Coalesce) else node.args["true"], fields)
    return "double"
