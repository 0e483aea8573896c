"""Malformed patterns are refused at validation, naming the stage and the problem."""

from __future__ import annotations

import pytest

import spanflow as sf
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


def _readings() -> sf.Stream:
    schema = {"device": "string", "ts": "timestamp", "t": "double"}
    return sf.Pipeline("p").source("S", schema=schema, key="device", event_time="ts")


def test_a_pattern_step_takes_one_of_pattern_rules_or_rule_set():
    s = _readings()
    hot = Pattern.begin("hot").where("t > 80")
    step = s.match(hot, select={"peak": "max(hot.t)"}, id="m").sink_console(id="o").spec().step("m")
    assert [r.name for r in step.static_rules()] == ["m"]
    many = s.match(rules=[hot.rule("a"), hot.rule("b", timeouts=True)], id="m")
    assert [r.name for r in many.sink_console(id="o").spec().step("m").static_rules()] == ["a", "b"]
    live = s.match(rule_set="plant", id="m").sink_console(id="o").spec()
    assert live.step("m").rule_set == "plant"
    with pytest.raises(SpecError, match="exactly one of pattern, rules or rule_set"):
        s.match(hot, rule_set="plant")
    with pytest.raises(SpecError, match="exactly one of pattern, rules or rule_set"):
        s.match()
    with pytest.raises(SpecError, match="belong to the pattern form"):
        s.match(rule_set="plant", select={"x": "count(hot)"})
    with pytest.raises(SpecError, match=r"rules \['a'\] are named twice"):
        s.match(rules=[hot.rule("a"), hot.rule("a")])
    with pytest.raises(SpecError, match=r"select 'peak'.*no stage 'cold'"):
        s.match(hot, select={"peak": "max(cold.t)"})
    with pytest.raises(SpecError, match="are fields every match row has"):
        s.match(hot, select={"rule": "count(hot)"})


def test_a_pattern_needs_a_key_and_event_time():
    hot = Pattern.begin("hot").where("t > 80")
    no_key = sf.Pipeline("p").source(
        "S", schema={"ts": "timestamp", "t": "double"}, event_time="ts"
    )
    with pytest.raises(SpecError, match="matches per key: add key_by"):
        no_key.match(hot).sink_console().spec()
    no_time = sf.Pipeline("p").source("S", schema={"d": "string", "t": "double"}, key="d")
    with pytest.raises(SpecError, match="orders each key's events by event time"):
        no_time.match(hot).sink_console().spec()
