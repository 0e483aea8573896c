"""FlinkCEP's AfterMatchSkipITCase, ported: each after-match skip strategy.
FlinkCEP feeds these events without timestamps (all at one time); so do we."""

from __future__ import annotations

from spanflow.api.patterns import Pattern
from tests.cep.harness import expect, matched


def has(letter: str) -> str:
    return f"name LIKE '%{letter}%'"


def events(*names: str, ids: tuple[int, ...] | None = None) -> list[tuple[int, str, float, int]]:
    idents = ids or tuple(range(1, len(names) + 1))
    return [(i, n, 0.0, 0) for i, n in zip(idents, names, strict=True)]


SIX_A = events("a", "a", "a", "a", "a", "a")


def test_no_skip():
    p = Pattern.begin("start").where("name = 'a'").times(3)
    assert matched(p, SIX_A) == expect([(1, 2, 3), (2, 3, 4), (3, 4, 5), (4, 5, 6)])


def test_skip_past_last_event():
    p = Pattern.begin("start").where("name = 'a'").times(3).skip_past_last_event()
    assert matched(p, SIX_A) == expect([(1, 2, 3), (4, 5, 6)])


def _two_followed_by_any(p: Pattern) -> list[tuple[int, ...]]:
    return matched(p, [(1, "a", 0.0, 0), (2, "b", 0.0, 0), (4, "a", 0.0, 0), (5, "b", 0.0, 0)])


def test_no_skip_and_skip_to_next_with_followed_by_any():
    p = Pattern.begin("start").where("name = 'a'").followed_by_any("end").where("name = 'b'")
    assert _two_followed_by_any(p) == expect([(1, 2), (1, 5), (4, 5)])
    assert _two_followed_by_any(p.skip_to_next()) == expect([(1, 2), (4, 5)])


def _quantifier_at_end(p: Pattern) -> list[tuple[int, ...]]:
    return matched(p, [(1, "a", 0.0, 0), (2, "b", 0.0, 0), (4, "b", 0.0, 0), (5, "b", 0.0, 0)])


def test_quantifier_at_the_end():
    p = Pattern.begin("start").where("name = 'a'").next("end").where("name = 'b'").one_or_more()
    assert _quantifier_at_end(p) == expect([(1, 2, 4, 5), (1, 2, 4), (1, 2)])
    assert _quantifier_at_end(p.skip_to_next()) == [(1, 2)]


AB7 = events(*["ab"] * 7)


def test_skip_to_first_and_last():
    base = Pattern.begin("start").where(has("a")).times(2).next("end").where(has("b")).times(2)
    assert matched(base.skip_to_first("end"), AB7[:6]) == expect([(1, 2, 3, 4), (3, 4, 5, 6)])
    assert matched(base.skip_to_last("end"), AB7) == expect([(1, 2, 3, 4), (4, 5, 6, 7)])


def test_skip_past_last_with_any_branches():  # testSkipPastLast2
    evs = events("a1", "a2", "b1", "b2", "c1", "c2", "d1", "d2")
    p = (
        Pattern.begin("a").where(has("a"))
        .followed_by_any("b").where(has("b"))
        .followed_by_any("c").where(has("c"))
        .followed_by("d").where(has("d"))
        .skip_past_last_event()
    )  # fmt: skip
    assert matched(p, evs) == [(1, 3, 5, 7)]


def test_skip_past_last_with_strict_next():  # testSkipPastLast3
    p = Pattern.begin("a").where(has("a")).next("b").where(has("b")).skip_past_last_event()
    assert matched(p, events("a1", "c", "a2", "b2")) == [(3, 4)]


def test_skip_to_first_with_optional_match_and_at_start():
    evs = events("ab1", "c1", "ab2", "c2")
    p = (
        Pattern.begin("x").where(has("x")).one_or_more().optional()
        .next("b").where(has("b"))
        .next("c").where(has("c"))
        .skip_to_first("b")
    )  # fmt: skip
    assert matched(p, evs) == expect([(1, 2), (3, 4)])
    p = Pattern.begin("b").where(has("b")).next("c").where(has("c")).skip_to_first("b")
    assert matched(p, evs) == expect([(1, 2), (3, 4)])


ABABBAB = events("a1", "b1", "a2", "b2", "b3", "a3", "b4")


def test_skip_to_first_and_last_with_one_or_more():
    base = Pattern.begin("a").where(has("a")).next("b").where(has("b")).one_or_more().consecutive()
    assert matched(base.skip_to_first("b"), ABABBAB) == expect([(1, 2), (3, 4), (6, 7)])
    assert matched(base.skip_to_last("b"), ABABBAB) == expect([(1, 2), (3, 4), (6, 7)])


def test_skipping_to_a_stage_the_match_lacks_skips_nothing():  # ...WithoutException
    p = (
        Pattern.begin("a").where(has("a"))
        .next("b").where(has("b")).one_or_more().optional().consecutive()
        .next("c").where(has("c"))
    )  # fmt: skip
    evs = [(1, "a", 0.0, 0), (4, "c", 0.0, 0)]
    assert matched(p.skip_to_first("b"), evs) == [(1, 4)]
    assert matched(p.skip_to_last("b"), evs) == [(1, 4)]


AAAB = events("a1", "a2", "a3", "b1")


def test_docs_examples_with_greedy_one_or_more_at_the_beginning():
    base = Pattern.begin("a").where(has("a")).one_or_more().consecutive().greedy()
    p = base.next("b").where(has("b"))
    assert matched(p.skip_past_last_event(), AAAB) == [(1, 2, 3, 4)]
    assert matched(p.skip_to_last("a"), AAAB) == expect([(1, 2, 3, 4), (3, 4)])
    assert matched(p.skip_to_first("a"), AAAB) == expect([(1, 2, 3, 4), (2, 3, 4), (3, 4)])
    assert matched(p.no_skip(), AAAB) == expect([(1, 2, 3, 4), (2, 3, 4), (3, 4)])


def test_skip_to_first_discarding():  # docs example
    evs = events("a", "b", "c1", "c2", "c3", "d")
    p = (
        Pattern.begin("a_or_c").where(f"{has('a')} OR {has('c')}")
        .followed_by("b_or_c").where(f"{has('b')} OR {has('c')}")
        .followed_by("cs").where(has("c")).one_or_more().greedy()
        .followed_by("d").where(has("d"))
        .skip_to_first("cs")
    )  # fmt: skip
    assert matched(p, evs) == expect([(1, 2, 3, 4, 5, 6), (3, 4, 5, 6)])


def test_skip_before_other_already_completed():  # iterative condition on an earlier stage
    evs = [(1, "a1", 0.0, 0), (2, "c1", 0.0, 0), (3, "a2", 1.0, 0), (4, "c2", 0.0, 0),
           (5, "b1", 1.0, 0), (6, "b2", 0.0, 0)]  # fmt: skip
    p = (
        Pattern.begin("a").where(has("a"))
        .followed_by("c").where(has("c"))
        .followed_by("b").where(f"{has('b')} AND first(a.price) = price")
        .skip_to_first("c")
    )  # fmt: skip
    assert matched(p, evs) == expect([(1, 2, 6), (3, 4, 5)])


def test_the_event_store_is_emptied_after_matches():  # testSharedBufferIsProperlyCleared
    from spanflow.cep.nfa import NFA

    nfa = NFA(Pattern.begin("start").times(2).skip_past_last_event().spec())
    state = nfa.initial_state()
    for i in range(4):
        nfa.advance_time(state, i)
        nfa.process(state, {"id": 1, "name": "a", "price": 1.0}, i)
    assert state.events == {} and state.completed == []
