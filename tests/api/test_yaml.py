from __future__ import annotations

import json
from pathlib import Path

import pytest

import spanflow as sf
from spanflow.errors import PipelineFileError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

GOOD = """\
name: classic
sources:
  - id: in
    stream: IN
    schema: {device: string, v: double, ts: timestamp}
    key: device
    event_time: ts
    to: [fwd]
processors:
  - {id: fwd, type: forward, to: [plus]}
  - {id: plus, type: sum, field: v, value: 10, to: [per_key, avg]}
  - {id: per_key, type: count, to: [counts]}
  - {id: avg, type: average, field: v, window: 10s, to: [avgs]}
sinks:
  - {id: counts, type: console}
  - {id: avgs, type: parquet, path: /tmp/avgs}
"""


def test_classic_processor_types_load():
    spec = sf.load_pipeline_text(GOOD)
    assert [s.type for s in spec.topological()] == [
        "source",
        "forward",
        "sum",
        "count",
        "average",
        "sink",
        "sink",
    ]
    assert spec.step("plus").inputs == ("fwd",)
    assert spec.step("avg").window == 10.0  # type: ignore[union-attr]


def _error(text: str) -> PipelineFileError:
    with pytest.raises(PipelineFileError) as info:
        sf.load_pipeline_text(text, "p.yaml")
    return info.value


def test_unknown_field_names_file_line_and_field():
    err = _error(GOOD.replace("field: v, value: 10", "field: v, valeu: 10"))
    assert "p.yaml:11: processors[1].valeu: Extra inputs are not permitted" in str(err)


def test_bad_duration_names_its_line():
    err = _error(GOOD.replace("window: 10s", "window: 10 parsecs"))
    assert str(err).startswith("p.yaml:13: processors[3].window: expected a duration")


def test_unknown_processor_type_lists_allowed_types():
    err = _error(GOOD.replace("type: forward", "type: teleport"))
    assert "p.yaml:10: processors[0].type: unknown type 'teleport'" in str(err)
    assert "forward" in str(err)


def test_unknown_to_target_is_reported_at_the_to_field():
    err = _error(GOOD.replace("to: [counts]", "to: [cuonts]"))
    assert "p.yaml:12: processors[2].to: unknown step 'cuonts'" in str(err)


def test_yaml_syntax_error_has_a_line():
    err = _error("name: x\nsources: [\n  - id: a\n")
    assert err.problems[0][0] is not None and "not valid YAML" in str(err)


def test_optional_type_in_a_flow_mapping_gets_a_quoting_hint():
    err = _error("name: x\nsources:\n  - {id: a, schema: {id: long?, v: double}}\n")
    assert str(err).startswith("p.yaml:3:") and 'quote a type that ends in "?"' in str(err)


def test_missing_required_field_of_a_sink():
    err = _error(
        GOOD.replace("{id: counts, type: console}", "{id: counts, type: jetstream, stream: C}")
    )
    assert "p.yaml:15: sinks[0]: a jetstream sink needs 'stream' and 'subject'" in str(err)


def test_yaml_never_constructs_python_objects():
    err = _error("name: !!python/object/apply:os.system ['echo hacked']\n")
    assert "p.yaml:1: name: YAML tag" in str(err) and "not allowed" in str(err)


def test_example_yaml_equals_the_python_demo_pipeline():
    from spanflow.demo import sensor_alerts

    def normal(spec: sf.PipelineSpec) -> dict:
        data = json.loads(spec.to_json())
        data["steps"].sort(key=lambda s: s["id"])
        return data

    assert normal(sf.load_pipeline(EXAMPLES / "sensor_alerts.yaml")) == normal(
        sensor_alerts().spec()
    )


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(PipelineFileError, match="cannot read"):
        sf.load_pipeline(tmp_path / "nope.yaml")
