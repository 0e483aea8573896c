"""Pattern conditions: Spark SQL semantics evaluated in Python."""

from __future__ import annotations

import pytest

from spanflow.spec.expressions import ExpressionError, compile_expression


def value(text: str, event: dict | None = None, matched: dict | None = None, **kw: object):
    return compile_expression(text, **kw).evaluate(event or {}, matched or {})  # type: ignore[arg-type]


def test_three_valued_logic_like_spark():
    assert value("x > 1", {"x": None}) is None
    assert value("x > 1 OR y = 2", {"x": None, "y": 2}) is True
    assert value("x > 1 AND y = 2", {"x": None, "y": 3}) is False
    assert value("NOT (x > 1)", {"x": None}) is None
    assert value("x IS NULL", {"x": None}) is True
    assert value("x IN (1, NULL)", {"x": 2}) is None
    assert value("x IN (1, 2)", {"x": 2}) is True
    assert not compile_expression("x > 1").holds({"x": None}, {})


def test_arithmetic_functions_and_strings():
    assert value("x / 0", {"x": 1}) is None
    assert value("x % 3", {"x": 7}) == 1
    assert value("abs(x) + round(y, 1)", {"x": -2, "y": 1.26}) == pytest.approx(3.3)
    assert value("coalesce(x, y, 3)", {"x": None, "y": None}) == 3
    assert value("name LIKE 'fo_%'", {"name": "foo1"}) is True
    assert value("lower(name) = 'abc'", {"name": "ABC"}) is True
    assert value("x BETWEEN 1 AND 3", {"x": 3}) is True
    assert value("CAST(x AS DOUBLE) / 2", {"x": 3}) == 1.5
    assert value("IF(x > 1, 'hi', 'lo')", {"x": 2}) == "hi"
    assert value("greatest(x, y)", {"x": 1, "y": None}) == 1


def test_aggregates_over_earlier_stages():
    matched = {"hot": [{"t": 81.0}, {"t": 85.0}, {"t": None}]}
    stages = {"hot"}
    assert value("count(hot)", matched=matched, stages=stages) == 3
    assert value("count(hot.t)", matched=matched, stages=stages) == 2
    assert (
        value("first(hot.t) + last(hot.t)", matched={"hot": [{"t": 1}, {"t": 2}]}, stages=stages)
        == 3
    )
    assert value("avg(hot.t)", matched=matched, stages=stages) == 83.0
    assert value("max(hot.t) - min(hot.t)", matched=matched, stages=stages) == 4.0
    assert value("hot.t", matched=matched, stages=stages) == 81.0  # the stage's first event
    assert value("sum(hot.t)", matched={}, stages=stages) is None  # no events yet: NULL
    assert value("count(hot)", matched={}, stages=stages) == 0
    assert value("list(hot.t)", matched=matched, stages=stages, selection=True) == [
        81.0,
        85.0,
        None,
    ]


def test_errors_name_the_problem():
    with pytest.raises(ExpressionError, match="not a SQL expression"):
        compile_expression("x >")
    with pytest.raises(ExpressionError, match="no stage 'cold' before this one"):
        compile_expression("first(cold.t) > 1", stages={"hot"})
    with pytest.raises(ExpressionError, match=r"list.*for selections"):
        compile_expression("list(hot.t) IS NULL", stages={"hot"})
    with pytest.raises(ExpressionError, match="not supported in patterns"):
        compile_expression("sha2(x, 256) = 'a'")
    with pytest.raises(ExpressionError, match="'hot' is a stage"):
        compile_expression("hot > 1", stages={"hot"})
    with pytest.raises(ExpressionError, match=r"avg takes a stage's field"):
        compile_expression("avg(t) > 1", stages={"hot"})
