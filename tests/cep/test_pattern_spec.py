"""Malformed patterns are refused at validation, naming the stage and the problem."""

from __future__ import annotations

import pytest

from spanflow.api.patterns import Pattern
from spanflow.errors import SpecError
from spanflow.spec.patterns import PatternSpec

BASE = Pattern.begin("hot").where("t > 80")


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (BASE.followed_by("hot"), "stage 'hot': the name is used twice"),
        (
            BASE.not_followed_by("cool"),
            "stage 'cool': a pattern that ends with not_followed_by needs within",
        ),
        (BASE.not_next("x").times(2), "stage 'x': not_next takes no quantifier"),
        (
            BASE.optional().not_followed_by("x").followed_by("y"),
            "not_followed_by after the optional stage 'hot'",
        ),
        (
            BASE.greedy().followed_by("y"),
            "stage 'hot': greedy applies to times/one_or_more stages only",
        ),
        (
            BASE.consecutive().followed_by("y"),
            "stage 'hot': consecutive applies to times/one_or_more",
        ),
        (
            BASE.times(2).until("t < 1").followed_by("y"),
            "stage 'hot': until applies to one_or_more",
        ),
        (BASE.times(3, 2), r"stage 'hot': times\(3, 2\) needs 1 <= fewest <= most"),
        (BASE.followed_by("y").skip_to_first("z"), r"skip_to_first\('z'\): no such stage"),
        (Pattern.begin("bad name"), "stages\\[0\\].name"),
    ],
)
def test_malformed_patterns_name_the_stage(pattern: Pattern, message: str):
    with pytest.raises(SpecError, match=message):
        pattern.spec()


def test_bad_conditions_name_the_stage_at_validation():
    with pytest.raises(SpecError, match=r"stage 'drop', where: .*no stage 'cold'"):
        BASE.followed_by("drop").where("pressure < first(cold.pressure)").spec()
    with pytest.raises(SpecError, match=r"stage 'drop', where: .* is not a SQL expression"):
        BASE.followed_by("drop").where("pressure <").spec()
    with pytest.raises(ValueError, match=r"stage 'x', until: .*'hot' is a stage"):
        PatternSpec.model_validate(
            {
                "stages": [
                    {"name": "hot"},
                    {"name": "x", "one_or_more": True, "until": "hot > 1"},
                    {"name": "y"},
                ]
            }
        )


def test_a_pattern_is_plain_data():
    p = (
        BASE.followed_by("drop")
        .where("p < 2")
        .or_where("p > 9")
        .within("30s")
        .skip_past_last_event()
    )
    spec = p.spec()
    assert PatternSpec.model_validate(spec.model_dump()) == spec
    assert spec.stage("drop").where == "(p < 2) OR (p > 9)"
    assert spec.within == 30.0 and spec.skip == "skip_past_last_event"
    assert BASE.times(0, 3).spec().stage("hot").optional
