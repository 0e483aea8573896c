"""FlinkCEP's NotPatternITCase, ported: not_next and not_followed_by, before and after
quantified and optional stages, and a trailing not_followed_by with within."""

from __future__ import annotations

from spanflow.api.patterns import Pattern
from tests.cep.harness import expect, matched


def name(value: str) -> str:
    return f"name = '{value}'"


ACBCD = [(40, "a", 1.0, 1), (41, "c", 2.0, 2), (42, "b", 3.0, 3), (43, "c", 4.0, 4),
         (44, "d", 4.0, 5)]  # fmt: skip


def test_not_next():
    p = (
        Pattern.begin("start").where(name("a"))
        .not_next("not_pattern").where(name("b"))
        .followed_by_any("middle").where(name("c"))
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, ACBCD) == expect([(40, 41, 44), (40, 43, 44)])


def test_not_next_without_matches():
    events = [(40, "a", 1.0, 1), (42, "b", 3.0, 2), (41, "c", 2.0, 3), (43, "c", 4.0, 4),
              (44, "d", 4.0, 5)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("a"))
        .not_next("not_pattern").where(name("b"))
        .followed_by("middle").where(name("c"))
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, events) == []


def test_not_next_at_the_end():
    events = [(40, "a", 1.0, 1), (41, "c", 2.0, 2), (43, "c", 4.0, 3), (44, "d", 4.0, 4),
              (42, "b", 3.0, 5)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("a"))
        .followed_by_any("middle").where(name("c"))
        .followed_by_any("end").where(name("d"))
        .not_next("not_pattern").where(name("b"))
    )  # fmt: skip
    assert matched(p, events) == []


def test_not_followed_by():
    p = (
        Pattern.begin("start").where(name("a"))
        .not_followed_by("not_pattern").where(name("b"))
        .followed_by_any("middle").where(name("c"))
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, ACBCD) == [(40, 41, 44)]
    optional_middle = (
        Pattern.begin("start").where(name("a"))
        .not_followed_by("not_pattern").where(name("b"))
        .followed_by_any("middle").where(name("c")).optional()
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(optional_middle, ACBCD) == [(40, 41, 44)]


def test_times_with_not_followed_by():
    events = [(40, "a", 1.0, 1), (41, "b", 2.0, 2), (42, "c", 3.0, 3), (43, "b", 4.0, 4),
              (44, "d", 4.0, 5)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("a"))
        .followed_by_any("middle").where(name("b")).times(2)
        .not_followed_by("not_pattern").where(name("c"))
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, events) == []


def test_ignore_state_of_times_with_not_followed_by():
    events = [(40, "a", 1.0, 1), (45, "d", 6.0, 2), (41, "e", 2.0, 1), (43, "b", 4.0, 3),
              (42, "c", 3.0, 2), (44, "c", 5.0, 4), (46, "d", 7.0, 5)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("a"))
        .not_followed_by("not_pattern").where(name("b"))
        .followed_by_any("middle").where(name("c")).times(2).optional()
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, events) == [(40, 45)]


def test_times_with_not_followed_by_after():
    events = [(40, "a", 1.0, 1), (46, "d", 7.0, 2), (41, "e", 2.0, 1), (43, "b", 4.0, 3),
              (44, "b", 5.0, 3), (42, "c", 3.0, 2), (47, "d", 8.0, 5)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("a"))
        .followed_by_any("middle").where(name("b")).times(2)
        .not_followed_by("not_pattern").where(name("c"))
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, events) == []


def test_not_followed_by_before_optional_at_the_end():
    events = ACBCD[:4]
    p = (
        Pattern.begin("start").where(name("a"))
        .not_followed_by("not_pattern").where(name("b"))
        .followed_by_any("end").where(name("c")).optional()
    )  # fmt: skip
    assert matched(p, events) == expect([(40, 41), (40,)])


def test_not_followed_by_before_optional_times():
    p = (
        Pattern.begin("start").where(name("a"))
        .not_followed_by("not_pattern").where(name("b"))
        .followed_by_any("middle").where(name("c")).times(2).optional()
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, ACBCD) == [(40, 41, 43, 44)]


def test_not_followed_by_with_branching_at_start():
    events = [(40, "a", 1.0, 1), (42, "b", 3.0, 2), (41, "c", 2.0, 3), (141, "a", 4.0, 4),
              (43, "c", 5.0, 5), (44, "d", 6.0, 6)]  # fmt: skip
    p = (
        Pattern.begin("start").where(name("a"))
        .not_followed_by("not_pattern").where(name("b"))
        .followed_by("middle").where(name("c"))
        .followed_by("end").where(name("d"))
    )  # fmt: skip
    assert matched(p, events) == [(43, 44, 141)]


# FlinkCEP's NotFollowByData: A_1 B_1 B_2 B_3 C_1 B_4 B_5 B_6 D_1 (distinct ids here)
A1, B1, B2, B3, C1, B4, B5, B6, D1 = 40, 41, 42, 142, 43, 242, 342, 442, 143


def _at(idents_names: list[tuple[int, str]]) -> list[tuple[int, str, float, int]]:
    return [(i, n, 0.0, t) for t, (i, n) in enumerate(idents_names)]


def test_not_next_after_one_or_more():
    events = _at([(A1, "a"), (B1, "b"), (C1, "c"), (B2, "b"), (D1, "d")])
    for any_b, expected in ((False, []), (True, [(A1, B2, D1)])):
        p = Pattern.begin("a").where(name("a"))
        p = p.followed_by_any("bs") if any_b else p.followed_by("bs")
        p = (
            p.where(name("b")).one_or_more()
            .not_next("not_c").where(name("c"))
            .followed_by("d").where(name("d"))
        )  # fmt: skip
        assert matched(p, events) == expect(expected), any_b


def test_not_followed_by_after_one_or_more():
    events = _at([(A1, "a"), (B1, "b"), (B2, "b"), (B3, "b"), (C1, "c"), (B4, "b"), (B5, "b"),
                  (B6, "b"), (D1, "d")])  # fmt: skip
    eager_any = [(A1, B4, B5, B6, D1), (A1, B4, B5, D1), (A1, B4, D1), (A1, B5, B6, D1),
                 (A1, B5, D1), (A1, B6, D1)]  # fmt: skip
    for eager in (True, False):
        for any_b in (False, True):
            p = Pattern.begin("a").where(name("a"))
            p = (p.followed_by_any("bs") if any_b else p.followed_by("bs")).where(name("b"))
            p = p.one_or_more() if eager else p.one_or_more().allow_combinations()
            p = p.not_followed_by("not_c").where(name("c")).followed_by("d").where(name("d"))
            expected = [] if not any_b else eager_any + ([] if eager else [(A1, B4, B6, D1)])
            assert matched(p, events) == expect(expected), (eager, any_b)


def test_not_followed_by_before_one_or_more_and_zero_or_more():
    events = _at([(A1, "a"), (B1, "b"), (C1, "c"), (B4, "b"), (B5, "b"), (B6, "b"), (D1, "d")])
    eager = [(A1, B1, B4, B5, B6, D1), (A1, B1, B4, B5, D1), (A1, B1, B4, D1), (A1, B1, D1)]
    combinations = [*eager, (A1, B1, B4, B6, D1), (A1, B1, B5, B6, D1), (A1, B1, B5, D1),
                    (A1, B1, B6, D1)]  # fmt: skip
    for optional in (False, True):
        for is_eager in (True, False):
            for any_b in (True, False):
                p = Pattern.begin("a").where(name("a")).not_followed_by("not_c").where(name("c"))
                p = (p.followed_by_any("bs") if any_b else p.followed_by("bs")).where(name("b"))
                p = p.one_or_more()
                p = p.optional() if optional else p
                p = p if is_eager else p.allow_combinations()
                p = p.followed_by("d").where(name("d"))
                expected = eager if is_eager else combinations
                assert matched(p, events) == expect(expected), (optional, is_eager, any_b)


def test_not_followed_by_within_at_the_end():
    events = [(40, "a", 1.0, 1), (41, "b", 2.0, 2), (42, "a", 3.0, 4), (43, "c", 4.0, 5),
              (44, "b", 5.0, 10), (45, "a", 7.0, 11), (46, "b", 8.0, 13)]  # fmt: skip
    p = (
        Pattern.begin("a").where(name("a"))
        .not_followed_by("b").where(name("b"))
        .within(0.003)
    )  # fmt: skip
    assert matched(p, events) == [(42,)]


def test_not_followed_by_before_times_within():
    events = [(40, "a", 1.0, 1), (41, "b", 2.0, 2), (42, "a", 3.0, 10), (43, "c", 4.0, 11),
              (44, "c", 5.0, 12), (45, "a", 7.0, 20), (46, "c", 8.0, 21),
              (47, "c", 8.0, 24)]  # fmt: skip
    p = (
        Pattern.begin("a").where(name("a"))
        .not_followed_by("b").where(name("b"))
        .followed_by("c").where(name("c")).times(0, 2)
        .within(0.003)
    )  # fmt: skip
    assert matched(p, events) == expect([(40,), (42,), (42, 43), (42, 43, 44), (45,), (45, 46)])


def test_not_followed_by_within_at_the_end_after_a_match():
    events = [(40, "a", 1.0, 1), (41, "a", 2.0, 2), (42, "a", 3.0, 3), (43, "c", 4.0, 4),
              (44, "c", 5.0, 10)]  # fmt: skip
    p = (
        Pattern.begin("a").where(name("a")).one_or_more().allow_combinations()
        .followed_by("c").where(name("c"))
        .not_followed_by("b").where(name("b"))
        .within(0.005)
        .skip_past_last_event()
    )  # fmt: skip
    assert matched(p, events) == [(40, 41, 42, 43)]
