"""FlinkCEP's NFAITCase (quantifier cases), TimesRangeITCase, TimesOrMoreITCase,
GreedyITCase and UntilConditionITCase, ported to the pure NFA."""

from __future__ import annotations

from spanflow.api.patterns import Pattern
from tests.cep.harness import expect, matched


def name(value: str) -> str:
    return f"name = '{value}'"


def test_strict_after_zero_or_more_without_results():  # ...NoResultsAfterZeroOrMore
    events = [(40, "d", 2.0, 1), (41, "a", 2.0, 2), (42, "a", 2.0, 3), (43, "c", 3.0, 4),
              (44, "b", 4.0, 5)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("d"))
        .followed_by("middle").where(name("a")).one_or_more().optional()
        .next("end").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == []


def test_strict_after_zero_or_more_with_results():  # testStrictContinuityResultsAfterZeroOrMore
    events = [(40, "d", 2.0, 1), (41, "a", 2.0, 2), (42, "a", 2.0, 3), (43, "b", 4.0, 5)]
    p = (
        Pattern.begin("start").where(name("d"))
        .followed_by_any("middle").where(name("a")).one_or_more().optional().allow_combinations()
        .next("end").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect([(40, 41, 42, 43), (40, 42, 43)])


CAAB = [(40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4), (44, "b", 5.0, 6)]


def test_at_least_one_with_combinations():  # testAtLeastOne
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by_any("middle").where(name("a")).one_or_more().allow_combinations()
        .followed_by_any("end1").where(name("b"))
    )  # fmt: skip
    assert matched(p, CAAB) == expect([(40, 41, 42, 44), (40, 41, 44), (40, 42, 44)])


def test_begin_with_at_least_one():  # testBeginWithAtLeastOne
    events = [(41, "a", 2.0, 3), (42, "a", 3.0, 4), (142, "a", 4.0, 5), (44, "b", 5.0, 6)]
    p = (
        Pattern.begin("start").where(name("a")).one_or_more().allow_combinations()
        .followed_by("end").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect(
        [(41, 42, 142, 44), (41, 42, 44), (41, 142, 44), (42, 142, 44), (41, 44), (42, 44),
         (142, 44)]
    )  # fmt: skip


def test_next_zero_or_more_consecutive():  # testNextZeroOrMore
    events = [(40, "start", 1.0, 1), (1, "event", 1.0, 2), (41, "middle", 2.0, 3),
              (42, "middle", 3.0, 4), (43, "middle", 4.0, 5), (46, "end", 1.0, 6)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("start"))
        .next("middle").where(name("middle")).one_or_more().optional().consecutive()
        .followed_by("end").where(name("end"))
    )  # fmt: skip
    assert matched(p, events) == [(40, 46)]


CAAAB = [(40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4), (43, "a", 4.0, 5),
         (44, "b", 5.0, 6)]  # fmt: skip


def test_at_least_one_relaxed():  # testAtLeastOneEager
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by_any("middle").where(name("a")).one_or_more()
        .followed_by_any("end1").where(name("b"))
    )  # fmt: skip
    assert matched(p, CAAAB) == expect(
        [(40, 41, 42, 43, 44), (40, 41, 42, 44), (40, 42, 43, 44), (40, 43, 44), (40, 42, 44),
         (40, 41, 44)]
    )  # fmt: skip


def test_optional():  # testOptional
    events = [(40, "c", 1.0, 1), (43, "a", 4.0, 5), (44, "b", 5.0, 6)]
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by("middle").where(name("a")).optional()
        .followed_by("end1").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect([(40, 43, 44), (40, 44)])


def test_times_with_combinations():  # testTimes
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 2), (42, "a", 3.0, 3), (43, "a", 4.0, 4),
              (44, "b", 5.0, 6)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("c"))
        .next("middle").where(name("a")).times(2).allow_combinations()
        .followed_by("end1").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect([(40, 41, 42, 44), (40, 41, 43, 44)])


def test_start_with_consecutive_times():  # testStartWithTimes
    events = [(41, "a", 2.0, 2), (42, "a", 3.0, 3), (43, "a", 4.0, 4), (44, "b", 5.0, 6)]
    p = (
        Pattern.begin("middle").where(name("a")).times(2).consecutive()
        .followed_by("end1").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect([(41, 42, 44), (42, 43, 44)])


# FlinkCEP's ConsecutiveData: c, a, a, a, b
START, M1, M2, M3, END = (
    (40, "c", 1.0),
    (41, "a", 2.0),
    (42, "a", 3.0),
    (43, "a", 4.0),
    (
        44,
        "b",
        5.0,
    ),
)


def test_times_with_next_and_combinations_skips_other_events():  # testTimesNonStrictWithNext
    events = [(*START, 1), (*M1, 2), (23, "f", 1.0, 3), (*M2, 4), (24, "f", 1.0, 5), (*M3, 6),
              (*END, 7)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("c"))
        .next("middle").where(name("a")).times(2).allow_combinations()
        .followed_by("end1").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect([(40, 41, 42, 44), (40, 41, 43, 44)])


# -- GreedyITCase -------------------------------------------------------------------------
def _greedy_middle(p: Pattern) -> Pattern:
    return p.followed_by("middle").where(name("a")).one_or_more().optional().greedy()


def test_greedy_zero_or_more():
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 2), (42, "a", 2.0, 3), (43, "a", 2.0, 4),
              (44, "d", 3.0, 5)]  # fmt: skip
    p = _greedy_middle(Pattern.begin("start").where(name("c"))).followed_by("end").where(name("d"))
    assert matched(p, events) == [(40, 41, 42, 43, 44)]


def test_greedy_zero_or_more_in_between_other_events():
    events = [(40, "c", 1.0, 1), (1, "dummy", 1111.0, 2), (41, "a", 2.0, 3),
              (2, "dummy", 1111.0, 4), (42, "a", 2.0, 5), (3, "dummy", 1111.0, 6),
              (43, "a", 2.0, 7), (44, "d", 3.0, 8)]  # fmt: skip
    p = _greedy_middle(Pattern.begin("start").where(name("c"))).followed_by("end").where(name("d"))
    assert matched(p, events) == [(40, 41, 42, 43, 44)]


def test_greedy_zero_or_more_with_other_events_after_and_before():
    after = [(40, "c", 1.0, 1), (41, "a", 2.0, 2), (42, "a", 2.0, 3), (43, "dummy", 2.0, 4),
             (44, "d", 3.0, 5)]  # fmt: skip
    p = _greedy_middle(Pattern.begin("start").where(name("c"))).followed_by("end").where(name("d"))
    assert matched(p, after) == [(40, 41, 42, 44)]
    before = [(40, "c", 1.0, 1), (43, "dummy", 2.0, 2), (44, "d", 3.0, 5)]
    assert matched(p, before) == [(40, 44)]


def test_greedy_until():  # testGreedyUtilZeroOrMoreWithDummyEventsAfterQuantifier
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 2), (42, "a", 3.0, 3), (43, "a", 3.0, 4),
              (44, "a", 4.0, 5), (45, "d", 3.0, 6)]  # fmt: skip
    p = (
        _greedy_middle(Pattern.begin("start").where(name("c")))
        .until("price > 3.0")
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, events) == [(40, 41, 42, 43, 45)]


def test_an_optional_stage_after_a_greedy_one_is_refused():
    import pytest

    from spanflow.errors import SpecError

    p = _greedy_middle(Pattern.begin("start").where(name("c"))).followed_by("d").optional()
    with pytest.raises(SpecError, match="optional stage cannot follow the greedy stage 'middle'"):
        p.followed_by("e").spec()
    with pytest.raises(SpecError, match="greedy stage cannot end a pattern"):
        _greedy_middle(Pattern.begin("start")).spec()


# -- UntilConditionITCase -----------------------------------------------------------------
UNTIL = "price = 5.0"


def _until(inner: str, optional: bool) -> Pattern:
    middle = Pattern.begin("start").where(name("c")).followed_by("middle").where(name("a"))
    middle = middle.one_or_more()
    if optional:
        middle = middle.optional()
    if inner == "any":
        middle = middle.allow_combinations()
    elif inner == "strict":
        middle = middle.consecutive()
    return middle.until(UNTIL).followed_by("end").where(UNTIL)


def test_until_after_one_or_more():
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4), (44, "a", 5.0, 6),
              (45, "a", 6.0, 7)]  # fmt: skip
    for optional in (False, True):
        for inner in ("relaxed", "strict"):
            expected = [(40, 41, 42, 44), (40, 41, 44)] + ([(40, 44)] if optional else [])
            assert matched(_until(inner, optional), events) == expect(expected), (inner, optional)


def test_until_after_one_or_more_with_combinations():
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4), (43, "a", 4.0, 5),
              (44, "a", 5.0, 6), (45, "a", 6.0, 7)]  # fmt: skip
    for optional in (False, True):
        expected = [(40, 41, 42, 43, 44), (40, 41, 42, 44), (40, 41, 43, 44), (40, 41, 44)]
        expected += [(40, 44)] if optional else []
        assert matched(_until("any", optional), events) == expect(expected), optional


def test_until_ends_a_followed_by_any_loop():
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4), (44, "a", 5.0, 6),
              (45, "a", 6.0, 7)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by_any("middle").where(name("a")).one_or_more().until(UNTIL)
    )  # fmt: skip
    assert matched(p, events) == expect([(40, 41, 42), (40, 41), (40, 42), (40, 45)])
