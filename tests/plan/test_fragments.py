"""How the planner splits pipelines into local and global fragments (no Spark needed)."""

from __future__ import annotations

import pytest

import spanflow as sf
from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.errors import SpecError
from spanflow.plan.fragments import PlanError, compile_fragments, fragments_of
from spanflow.spec import MergeStep, SinkStep, SourceStep, UnionStep, WindowStep
from spanflow.spec.topology import Topology

SCHEMA = {"device": "string", "reading": "string", "ts": "timestamp", "temperature": "double"}


def two_sites(*, subjects: bool = True) -> Topology:
    def hosted(site: str) -> dict:
        stream: dict = {"name": "SENSORS"}
        if subjects:
            stream["subjects"] = [f"sensors.{site}.>"]
        return stream

    return Topology.model_validate(
        {
            "sites": [{"name": "a"}, {"name": "b"}, {"name": "cloud", "kind": "cloud"}],
            "nodes": [
                {"name": "ea", "site": "a", "streams": [hosted("a")]},
                {"name": "eb", "site": "b", "streams": [hosted("b")]},
                {"name": "c1", "site": "cloud"},
            ],
            "links": [
                {"between": ["a", "cloud"], "latency": "30ms"},
                {"between": ["b", "cloud"], "latency": "50ms"},
            ],
        }
    )


def readings(p: sf.Pipeline) -> sf.Stream:
    return p.source(
        "SENSORS",
        subjects=["sensors.>"],
        schema=SCHEMA,
        key="device",
        event_time="ts",
        max_out_of_orderness="5s",
        id="readings",
    )


def by_id(fragments, fid):
    return next(f for f in fragments if f.id == fid)


def test_per_device_work_stays_at_each_site_and_the_overall_window_is_split():
    p = sf.Pipeline("mon")
    per_device = (
        readings(p)
        .filter("temperature > -40", id="valid")
        .key_by("device", id="by_device")
        .window(tumbling="10s")
        .aggregate(n="count", hi="max(temperature)", id="per_device")
    )
    alerts = per_device.filter("hi > 45", id="hot").sink_jetstream(
        "ALERTS", subject="alerts.{device}", id="alerts_out"
    )
    overall = (
        per_device.map(scope="'all'", id="tag")
        .key_by("scope", id="by_scope")
        .window(tumbling="10s")
        .aggregate(devices="count", mean_hi="avg(hi)", id="overall")
        .sink_jetstream("SUMMARY", subject="summary", id="summary_out")
    )
    compiled = compile_fragments(alerts.merge(overall).spec(), two_sites())
    assert [f.id for f in compiled.fragments] == ["mon.at-a", "mon.at-b", "mon.global"]
    local_a = by_id(compiled.fragments, "mon.at-a")
    assert local_a.kind == "local" and local_a.site == "a" and local_a.input_streams == ("SENSORS",)
    source = local_a.spec.sources()[0]
    assert source.filter_subjects == ("sensors.a.>",)
    assert source.subjects == ("sensors.a.>",)  # never captures other sites' data
    assert {"per_device", "hot", "alerts_out", "overall__partial"} <= set(local_a.steps)
    partial = local_a.spec.step("overall__partial")
    assert isinstance(partial, WindowStep) and partial.partial
    cut = next(s for s in local_a.spec.sinks() if s.inputs == ("overall__partial",))
    assert cut.subject == "spanflow.cut.mon.overall__partial.a"

    glob = by_id(compiled.fragments, "mon.global")
    assert glob.input_sites == ("a", "b") and glob.plan is not None
    assert glob.steps == ("overall", "summary_out")
    sources = glob.spec.sources()
    assert [s.filter_subjects for s in sources] == [
        ("spanflow.cut.mon.overall__partial.a",),
        ("spanflow.cut.mon.overall__partial.b",),
    ]
    assert all(s.schema_of == "overall__partial" and s.event_time == "window_end" for s in sources)
    assert any(isinstance(s, UnionStep) for s in glob.spec.steps)
    merge = glob.spec.step("overall")
    assert isinstance(merge, MergeStep) and merge.key == ("scope",)
    assert compiled.reasons["per_device"] == "keyed by device, which is born at one site"
    assert compiled.reasons["overall"].startswith("split:")
    assert compiled.scopes["summary_out"] == "global"


def test_a_window_over_several_sites_that_cannot_be_split_goes_global_with_raw_records():
    p = sf.Pipeline("dedup")
    flow = (
        readings(p)
        .deduplicate("reading", within="30s", id="once")
        .sink_jetstream("ONCE", subject="once", id="out")
    )
    compiled = compile_fragments(flow.spec(), two_sites())
    glob = by_id(compiled.fragments, "dedup.global")
    assert glob.steps == ("once", "out")
    cut_sources = glob.spec.sources()
    # Raw records cross with their event time and key, so the watermark and keys hold.
    assert {s.event_time for s in cut_sources} == {"ts"}
    assert {s.max_out_of_orderness for s in cut_sources} == {5.0}
    assert glob.spec.step("readings__key").key == ("device",)
    assert compiled.reasons["once"] == "keyed by ['reading'], which may span sites"


def test_a_pipeline_whose_data_is_at_one_site_is_one_fragment_there():
    topo = Topology.model_validate(
        {
            "sites": [{"name": "a"}],
            "nodes": [{"name": "ea", "site": "a", "streams": [{"name": "SENSORS"}]}],
        }
    )
    p = sf.Pipeline("one")
    flow = readings(p).deduplicate("reading", within="30s").sink_console()
    [fragment] = fragments_of(flow.spec(), topology=topo)
    assert fragment.id == "one.f0" and fragment.kind == "local" and fragment.site == "a"
    assert fragment.spec == flow.spec()  # unchanged: nothing to split


def test_pins_move_steps_and_carry_node_tags():
    p = sf.Pipeline("pins")
    scored = (
        readings(p)
        .key_by("reading", id="by_reading")
        .window(tumbling="10s")
        .aggregate(n="count", id="per_reading")
        .at_edge()
        .filter("n > 1", id="repeats")
        .on(tags=["gpu"])
    )
    to_cloud = scored.map(note="'seen twice'", id="note").in_cloud()
    flow = to_cloud.sink_jetstream("REPEATS", subject="repeats", id="out")
    compiled = compile_fragments(flow.spec(), two_sites())
    assert compiled.reasons["per_reading"] == "pinned at the edge: state per site"
    local_b = by_id(compiled.fragments, "pins.at-b")
    assert "repeats" in local_b.steps and local_b.node_tags == ("gpu",)
    glob = by_id(compiled.fragments, "pins.global")
    assert glob.cloud and glob.steps == ("note", "out")


def test_yaml_pins_are_the_same_as_the_fluent_ones():
    spec = load_pipeline_text(
        """
name: pins
sources:
  - {id: readings, stream: SENSORS, schema: {device: string, ts: timestamp},
     key: device, event_time: ts, to: [tag]}
processors:
  - {id: tag, type: map, columns: {x: "1"}, at: edge, node_tags: [gpu], to: [out]}
sinks:
  - {id: out, type: console, at: cloud}
"""
    )
    assert spec.step("tag").at == "edge" and spec.step("tag").node_tags == ("gpu",)
    assert spec.step("out").at == "cloud"
    compiled = compile_fragments(spec, two_sites())
    assert [f.id for f in compiled.fragments] == ["pins.at-a", "pins.at-b", "pins.global"]


def test_yaml_pin_typo_names_line_and_field():
    with pytest.raises(SpecError) as err:
        load_pipeline_text(
            """
name: bad
sources:
  - {id: r, stream: S, schema: {x: long}, to: [out]}
sinks:
  - id: out
    type: console
    at: fog
"""
        )
    assert "<string>:8: sinks[0].at:" in str(err.value)


def test_an_edge_pin_after_global_data_is_refused_with_the_step_named():
    p = sf.Pipeline("bad")
    flow = (
        readings(p)
        .deduplicate("reading", within="30s", id="once")
        .filter("temperature > 0", id="late_edge")
        .at_edge()
        .sink_console()
    )
    with pytest.raises(PlanError, match="step 'late_edge' is pinned at the edge"):
        compile_fragments(flow.spec(), two_sites())


def test_a_stream_at_several_sites_needs_subjects_per_site():
    p = sf.Pipeline("nosub")
    flow = readings(p).filter("temperature > 0").sink_console()
    with pytest.raises(PlanError, match="node ea must list the subjects"):
        compile_fragments(flow.spec(), two_sites(subjects=False))


def test_every_fragment_spec_is_valid_and_round_trips():
    p = sf.Pipeline("rt")
    flow = (
        readings(p)
        .map(scope="'all'")
        .key_by("scope")
        .window(sliding="20s", slide="10s")
        .aggregate(lo="min(temperature)", mean="avg(temperature)")
        .sink_jetstream("RT", subject="rt")
    )
    for fragment in fragments_of(flow.spec(), topology=two_sites()):
        again = type(fragment).model_validate_json(fragment.model_dump_json(by_alias=True))
        assert again == fragment
        assert all(isinstance(s, SourceStep | SinkStep) or s.inputs for s in again.spec.steps)


def test_union_from_python_and_yaml_is_the_same_and_stays_local_at_shared_sites():
    p = sf.Pipeline("u")
    src = readings(p)
    hot = src.filter("temperature > 40", id="hot")
    cold = src.filter("temperature < 0", id="cold")
    flow = hot.union(cold, id="extremes").sink_console(id="out")
    spec = flow.spec()
    assert spec.step("extremes").inputs == ("hot", "cold")
    from_yaml = load_pipeline_text(
        """
name: u
sources:
  - {id: readings, stream: SENSORS, subjects: ["sensors.>"], key: device, event_time: ts,
     max_out_of_orderness: 5s,
     schema: {device: string, reading: string, ts: timestamp, temperature: double},
     to: [hot, cold]}
processors:
  - {id: hot, type: filter, where: "temperature > 40", to: [extremes]}
  - {id: cold, type: filter, where: "temperature < 0", to: [extremes]}
  - {id: extremes, type: union, to: [out]}
sinks:
  - {id: out, type: console}
"""
    )
    assert {s.id: s for s in from_yaml.steps} == {s.id: s for s in spec.steps}
    compiled = compile_fragments(spec, two_sites())
    assert compiled.scopes["extremes"] == "local"
    assert [f.id for f in compiled.fragments] == ["u.at-a", "u.at-b"]


def test_a_union_needs_two_different_inputs():
    with pytest.raises(SpecError, match="union 'both' needs two or more different inputs"):
        load_pipeline_text(
            """
name: u1
sources:
  - {id: r, stream: S, schema: {x: long}, to: [both]}
processors:
  - {id: both, type: union, to: [out]}
sinks:
  - {id: out, type: console}
"""
        )


def test_a_cut_batches_at_the_pace_of_the_sinks_it_feeds():
    def flow(summary_trigger: str | None, alert_trigger: str | None = None) -> sf.Flow:
        p = sf.Pipeline("pace", trigger="2s")
        valid = readings(p).filter("temperature > -40", id="valid")
        alerts = valid.filter("temperature > 45", id="hot").sink_jetstream(
            "ALERTS", subject="alerts.{device}", id="alerts_out"
        )
        overall = (
            valid.map(scope="'all'", id="tag")
            .key_by("scope", id="by_scope")
            .window(tumbling="10s")
            .aggregate(n="count", id="overall")
        )
        summary = overall.sink_jetstream(
            "SUMMARY", subject="summary", trigger=summary_trigger, id="summary_out"
        )
        if alert_trigger is None:
            return alerts.merge(summary)
        late = overall.filter("n > 100", id="busy").sink_jetstream(
            "BUSY", subject="busy", trigger=alert_trigger, id="busy_out"
        )
        return alerts.merge(summary).merge(late)

    def cut_trigger(f: sf.Flow) -> float | None:
        local = by_id(compile_fragments(f.spec(), two_sites()).fragments, "pace.at-a")
        return next(s for s in local.spec.sinks() if s.inputs == ("overall__partial",)).trigger

    assert cut_trigger(flow(None)) is None  # the pipeline's 2 s
    assert cut_trigger(flow("10s")) == 10.0  # only a 10 s sink downstream
    assert cut_trigger(flow("10s", alert_trigger="5s")) == 5.0  # the fastest it feeds
    assert cut_trigger(flow("10s", alert_trigger="2s")) is None
    spec = flow("10s").spec()
    assert spec.step("summary_out").trigger == 10.0 and spec.step("alerts_out").trigger is None


def test_yaml_sink_trigger_is_the_same_as_the_fluent_one_and_checked():
    text = """
name: paced
trigger: 1s
sources:
  - {id: readings, stream: SENSORS, schema: {device: string}, to: [out]}
sinks:
  - {id: out, type: console, trigger: 10s}
"""
    spec = load_pipeline_text(text)
    assert spec.trigger == 1.0 and spec.step("out").trigger == 10.0
    fluent = sf.Pipeline("paced", trigger="1s").source(
        "SENSORS", schema={"device": "string"}, id="readings"
    )
    assert fluent.sink_console(trigger="10s", id="out").spec() == spec
    with pytest.raises(SpecError) as err:
        load_pipeline_text(text.replace("trigger: 10s}", "trigger: -3s}"))
    assert ":7: sinks[0].trigger" in str(err.value)
