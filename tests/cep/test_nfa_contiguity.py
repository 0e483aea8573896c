"""FlinkCEP's NFAITCase, ported: contiguity, optional and looping stages, branching,
time windows and time-outs. Conditions are the SQL equivalents of the Java ones
(``value.getName().equals("a")`` → ``name = 'a'``); events are (id, name, price, ts)."""

from __future__ import annotations

from spanflow.api.patterns import Pattern
from tests.cep.harness import expect, feed, ids, matched

ABCDE = [
    (40, "a", 1.0, 1),
    (41, "b", 2.0, 2),
    (42, "c", 3.0, 3),
    (43, "d", 4.0, 4),
    (44, "e", 5.0, 5),
]


def name(value: str) -> str:
    return f"name = '{value}'"


def test_no_condition_followed_by():  # testNoConditionNFA
    p = Pattern.begin("start").followed_by("end")
    assert matched(p, ABCDE) == [(40, 41), (41, 42), (42, 43), (43, 44)]


def test_no_condition_followed_by_any():  # testAnyWithNoConditionNFA
    p = Pattern.begin("start").followed_by_any("end")
    assert matched(p, ABCDE) == [
        (40, 41), (40, 42), (40, 43), (40, 44), (41, 42),
        (41, 43), (41, 44), (42, 43), (42, 44), (43, 44),
    ]  # fmt: skip


def test_simple_pattern():  # testSimplePatternNFA (SubEvent volume as a field)
    events = [
        (41, "start", 1.0, 1),
        (43, "foobar", 1.0, 2),
        (44, "barfoo", 5.0, 3),
        (42, "foo", 10.0, 3),
        (45, "start", 1.0, 4),
        (46, "end", 1.0, 5),
    ]
    p = (
        Pattern.begin("start").where(name("start"))
        .followed_by("middle").where("price > 5.0")
        .followed_by("end").where(name("end"))
    )  # fmt: skip
    assert matched(p, events) == [(41, 42, 46)]


def test_strict_contiguity():  # testStrictContinuityWithResults / NoResults
    p = Pattern.begin("middle").where(name("a")).next("end").where(name("b"))
    assert matched(p, [(41, "a", 2.0, 3), (42, "b", 4.0, 5)]) == [(41, 42)]
    assert matched(p, [(41, "a", 2.0, 3), (42, "c", 3.0, 4), (43, "b", 4.0, 5)]) == []


START_MIDDLE_END = [
    (1, "start", 1.0, 1),
    (2, "start", 1.0, 2),
    (3, "middle", 1.0, 3),
    (4, "foobar", 1.0, 4),
    (5, "end", 1.0, 11),
    (6, "end", 1.0, 13),
]


def test_within_discards_expired_partial_matches():  # testSimplePatternWithTimeWindowNFA
    p = (
        Pattern.begin("start").where(name("start"))
        .followed_by("middle").where(name("middle"))
        .followed_by("end").where(name("end"))
        .within(0.010)
    )  # fmt: skip
    assert matched(p, START_MIDDLE_END) == [(2, 3, 5)]


def test_timed_out_partial_matches_with_their_time():  # testSimplePatternWithTimeoutHandling
    p = (
        Pattern.begin("start").where(name("start"))
        .followed_by_any("middle").where(name("middle"))
        .followed_by_any("end").where(name("end"))
        .within(0.010)
    )  # fmt: skip
    matches, timeouts = feed(p, START_MIDDLE_END)
    assert len(matches) == 1
    assert sorted((ids(t), t.timed_out_at) for t in timeouts) == [
        ((1,), 11),
        ((1, 3), 11),
        ((2,), 12),
        ((2, 3), 12),
    ]


def test_branching():  # testBranchingPattern
    events = [
        (40, "start", 1.0, 1),
        (41, "foo1", 10.0, 3),
        (42, "foo2", 10.0, 4),
        (43, "foo3", 10.0, 5),
        (44, "next-one", 2.0, 6),
        (45, "next-one", 2.0, 7),
        (46, "end", 1.0, 8),
    ]
    p = (
        Pattern.begin("start").where(name("start"))
        .followed_by_any("middle_first").where("price > 5.0")
        .followed_by_any("middle_second").where(name("next-one"))
        .followed_by_any("end").where(name("end"))
    )  # fmt: skip
    assert matched(p, events) == expect((40, m, n, 46) for m in (41, 42, 43) for n in (44, 45))


def test_complex_branching_after_zero_or_more():  # testComplexBranchingAfterZeroOrMore
    events = [
        (40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4), (43, "a", 4.0, 5),
        (44, "b", 5.0, 6), (45, "d", 6.0, 7), (46, "d", 7.0, 8), (47, "e", 8.0, 9),
    ]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by_any("middle").where(name("a")).one_or_more().allow_combinations().optional()
        .followed_by_any("end1").where(name("b"))
        .followed_by_any("end2").where(name("d"))
        .followed_by_any("end3").where(name("e"))
    )  # fmt: skip
    middles = [(41, 42, 43), (41, 42), (41, 43), (42, 43), (41,), (42,), (43,), ()]
    expected = sorted(tuple(sorted((40, *m, 44, d, 47))) for d in (45, 46) for m in middles)
    assert matched(p, events) == expected


def test_zero_or_more_with_combinations():  # testZeroOrMore
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4), (44, "b", 5.0, 6)]
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by_any("middle").where(name("a")).one_or_more().allow_combinations().optional()
        .followed_by("end1").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect([(40, 41, 42, 44), (40, 41, 44), (40, 42, 44), (40, 44)])


def test_eager_zero_or_more():  # testEagerZeroOrMore
    events = [
        (40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4),
        (50, "d", 6.0, 5), (43, "a", 4.0, 6), (44, "b", 5.0, 7),
    ]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by("middle").where(name("a")).one_or_more().optional()
        .followed_by("end1").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect(
        [(40, 41, 42, 43, 44), (40, 41, 42, 44), (40, 41, 44), (40, 44)]
    )


def test_begin_with_zero_or_more():  # testBeginWithZeroOrMore
    events = [(40, "a", 2.0, 3), (41, "a", 3.0, 4), (141, "a", 3.0, 5), (42, "b", 4.0, 6)]
    p = (
        Pattern.begin("middle").where(name("a")).one_or_more().optional()
        .followed_by("end").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == expect(
        [(40, 41, 141, 42), (40, 41, 42), (41, 141, 42), (40, 42), (41, 42), (141, 42), (42,)]
    )


def test_zero_or_more_after_zero_or_more():  # testZeroOrMoreAfterZeroOrMore
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "d", 3.0, 4), (43, "d", 4.0, 5),
              (44, "e", 4.0, 6)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by_any("middle_first").where(name("a"))
        .one_or_more().allow_combinations().optional()
        .followed_by("middle_second").where(name("d"))
        .one_or_more().allow_combinations().optional()
        .followed_by("end").where(name("e"))
    )  # fmt: skip
    assert matched(p, events) == expect(
        [(40, 41, 42, 43, 44), (40, 41, 42, 44), (40, 42, 43, 44), (40, 42, 44), (40, 41, 44),
         (40, 44)]
    )  # fmt: skip


def test_zero_or_more_after_branching():  # testZeroOrMoreAfterBranching
    events = [(40, "c", 1.0, 1), (41, "a", 2.0, 3), (42, "a", 3.0, 4), (142, "f", 3.0, 5),
              (43, "d", 4.0, 6), (44, "d", 4.0, 7), (45, "e", 4.0, 8)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("c"))
        .followed_by_any("branching").where(name("a"))
        .followed_by_any("merging").where(name("f"))
        .followed_by_any("kleene").where(name("d")).one_or_more().allow_combinations().optional()
        .followed_by("end").where(name("e"))
    )  # fmt: skip
    expected = [
        tuple(sorted((40, b, 142, *k, 45))) for b in (41, 42) for k in ((), (43,), (44,), (43, 44))
    ]
    assert matched(p, events) == expect(expected)
