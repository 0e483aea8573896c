"""FlinkCEP's IterativeConditionsITCase, ported: conditions over what earlier stages
(and the stage itself) matched, written as SQL aggregates over stages."""

from __future__ import annotations

from spanflow.api.patterns import Pattern
from tests.cep.harness import expect, matched

S1, S2, S3, S4 = (401, "start", 1.0), (402, "start", 2.0), (403, "start", 3.0), (404, "start", 4.0)
M1, M2, M3, M4 = (41, "foo1", 1.0), (42, "foo2", 2.0), (43, "foo3", 3.0), (143, "foo4", 1.0)
NEXT, END = (44, "next-one", 1.0), (46, "end", 1.0)

SUM_BELOW_5 = "name LIKE 'foo%' AND coalesce(sum(middle.price), 0.0) + price < 5.0"


def test_iterative_with_branching():
    events = [(*S1, 1), (*M1, 2), (*M2, 3), (*S2, 4), (*M3, 5), (*M4, 5), (*NEXT, 6), (*END, 8)]
    base = Pattern.begin("start").where("name = 'start'").followed_by("middle").where(SUM_BELOW_5)
    eager = base.one_or_more().followed_by("end").where("name = 'end'")
    assert matched(eager, events) == expect(
        [
            (401, 46, 41, 42, 143),
            (401, 46, 42, 41),
            (401, 46, 41),
            (402, 46, 43, 143),
            (402, 46, 43),
        ]
    )
    combinations = base.one_or_more().allow_combinations().followed_by("end").where("name = 'end'")
    assert matched(combinations, events) == expect(
        [(401, 46, 41, 42, 143), (401, 46, 42, 41), (401, 46, 43, 41), (402, 46, 43, 143),
         (401, 46, 143, 41), (401, 46, 41), (402, 46, 43)]
    )  # fmt: skip


def test_iterative_condition_on_a_looping_first_stage():
    events = [(*S1, 1), (*S2, 2), (*S3, 3), (*END, 4)]
    cond = "name = 'start' AND coalesce(sum(start.price), 0.0) + price < 5.0"
    eager = Pattern.begin("start").where(cond).one_or_more().optional()
    eager = eager.followed_by("end").where("name = 'end'")
    assert matched(eager, events) == expect(
        [(401, 402, 46), (401, 46), (402, 46), (403, 46), (46,)]
    )
    combined = Pattern.begin("start").where(cond).one_or_more().allow_combinations().optional()
    combined = combined.followed_by("end").where("name = 'end'")
    assert matched(combined, events) == expect(
        [(401, 402, 46), (401, 403, 46), (401, 46), (402, 46), (403, 46), (46,)]
    )


def test_iterative_condition_on_an_earlier_stage():  # testIterativeWithPrevPatternDependency
    events = [(*S1, 1), (*S2, 2), (*END, 4)]
    p = (
        Pattern.begin("start").where("name = 'start'").one_or_more()
        .followed_by("end").where("name = 'end' AND coalesce(sum(start.price), 0) >= 2.0")
    )  # fmt: skip
    assert matched(p, events) == expect([(401, 402, 46), (402, 46)])


def test_iterative_aba_pattern():  # testIterativeWithABACPattern
    events = [(*S1, 1), (*M1, 2), (*S2, 2), (*S3, 2), (*M2, 2), (*S4, 2), (*M3, 2), (*M4, 2),
              (*END, 4)]  # fmt: skip
    p = (
        Pattern.begin("start").where("name = 'start'")
        .followed_by_any("middle1").where("name LIKE 'foo%'")
        .followed_by("middle2")
        .where("name = 'start' AND coalesce(sum(middle2.price), 0.0) + price <= 5.0")
        .one_or_more()
        .followed_by("end").where("name = 'end'")
    )  # fmt: skip
    assert matched(p, events) == expect(
        [(401, 402, 403, 41, 46), (401, 41, 402, 46), (401, 42, 404, 46), (402, 42, 404, 46),
         (403, 42, 404, 46)]
    )  # fmt: skip


def test_iterative_after_branching():  # testIterativeWithPrevPatternDependencyAfterBranching
    events = [(*S1, 1), (*S2, 2), (*M1, 4), (*S3, 5), (*M2, 6), (*END, 7)]
    p = (
        Pattern.begin("start").where("name = 'start'").one_or_more()
        .followed_by_any("middle1").where("name LIKE 'foo%'")
        .followed_by_any("end").where("name = 'end' AND coalesce(sum(start.price), 0) >= 2.0")
    )  # fmt: skip
    assert matched(p, events) == expect(
        [(401, 402, 41, 46), (402, 41, 46), (401, 402, 42, 46), (401, 402, 403, 42, 46),
         (402, 403, 42, 46), (402, 42, 46), (403, 42, 46)]
    )  # fmt: skip
