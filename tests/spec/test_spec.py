from __future__ import annotations

import pytest
from pydantic import ValidationError

from spanflow.errors import SpecError
from spanflow.spec import PipelineSpec, parse_aggregate, parse_duration
from spanflow.spec.durations import format_duration


def _src(**kw):
    return {
        "id": "in",
        "type": "source",
        "stream": "S",
        "schema": {"x": "long", "ts": "timestamp"},
        **kw,
    }


def _sink(inputs=("in",), **kw):
    return {"id": "out", "type": "sink", "kind": "console", "inputs": list(inputs), **kw}


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("10s", 10), ("2m", 120), ("1h", 3600), (3, 3)]
)
def test_durations_parse_and_format_back(text, seconds):
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("bad", ["10x", "-1s", "", True, None])
def test_bad_durations_are_rejected_with_the_value(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_aggregates_parse():
    assert parse_aggregate("count") == ("count", None)
    assert parse_aggregate("avg(temp)") == ("avg", "temp")
    assert parse_aggregate("mean(t)") == ("avg", "t")
    with pytest.raises(ValueError, match="needs a field"):
        parse_aggregate("sum")
    with pytest.raises(ValueError, match="not one of"):
        parse_aggregate("median(x)")


def test_spec_round_trips_through_json():
    spec = PipelineSpec.model_validate(
        {
            "name": "p",
            "trigger": "2s",
            "steps": [
                _src(event_time="ts", max_out_of_orderness="5s"),
                {
                    "id": "w",
                    "type": "window",
                    "sliding": {"size": "10s", "slide": "5s"},
                    "aggregates": {"n": "count"},
                    "inputs": ["in"],
                },
                _sink(("w",)),
            ],
        }
    )
    again = PipelineSpec.from_json(spec.to_json())
    assert again == spec
    assert again.step("w").kind == "sliding"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([_src(), _sink(("nope",))], "unknown step 'nope'"),
        (
            [_src(), {"id": "f", "type": "filter", "where": "x>1", "inputs": ["in"]}],
            "at least one sink",
        ),
        (
            [_src(), {"id": "f", "type": "filter", "where": "x>1", "inputs": ["in"]}, _sink()],
            "output of step 'f' goes nowhere",
        ),
        ([_src(), _src()], "used twice"),
        (
            [
                _src(),
                _sink(),
                {"id": "a", "type": "forward", "inputs": ["b"]},
                {"id": "b", "type": "forward", "inputs": ["a"]},
                {"id": "out2", "type": "sink", "kind": "console", "inputs": ["a"]},
            ],
            "cycle",
        ),
        ([_src(key="nope"), _sink()], "key 'nope' is not a field"),
        ([_src(event_time="x"), _sink()], "must be a timestamp field"),
    ],
)
def test_invalid_graphs_say_what_is_wrong(steps, message):
    with pytest.raises(ValidationError, match=message):
        PipelineSpec.model_validate({"name": "p", "steps": steps})


def test_schema_rejects_unknown_types_and_reserved_names():
    with pytest.raises(ValidationError, match="unknown type 'decimal'"):
        PipelineSpec.model_validate(
            {"name": "p", "steps": [_src(schema={"x": "decimal"}), _sink()]}
        )
    with pytest.raises(ValidationError, match="reserved"):
        PipelineSpec.model_validate(
            {"name": "p", "steps": [_src(schema={"_seq": "long"}), _sink()]}
        )


def test_window_needs_consistent_shape():
    base = {"id": "w", "type": "window", "inputs": ["in"], "aggregates": {"n": "count"}}
    for extra, message in (
        ({"kind": "sliding", "size": "10s"}, "needs 'slide'"),
        ({"kind": "session"}, "needs 'gap'"),
        ({"tumbling": "5s", "reduce": "m:f"}, "exactly one of"),
    ):
        with pytest.raises(ValidationError, match=message):
            PipelineSpec.model_validate(
                {"name": "p", "steps": [_src(), {**base, **extra}, _sink(("w",))]}
            )


def test_from_json_reports_the_path_of_the_error():
    with pytest.raises(SpecError, match=r"steps\[0\]"):
        PipelineSpec.from_json(
            '{"name": "p", "steps": [{"id": "in", "type": "source"}, {"id": "o", "type": "sink"}]}'
        )
