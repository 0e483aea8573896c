"""The planner places steps from their declared traits alone: keyed processors, count
windows, running aggregates, joins, enrichment and the model steps."""

from __future__ import annotations

import spanflow as sf
from spanflow.plan.fragments import compile_fragments
from spanflow.spec.topology import Topology
from tests.plan.test_fragments import readings, two_sites
from tests.spark.processors import RunningMean

MEAN_OUT = {"device": "string", "n": "long", "mean": "double"}


def _scopes(flow: sf.Flow, topology: Topology | None = None) -> dict[str, str]:
    return compile_fragments(flow.spec(), topology or two_sites()).scopes


def test_a_processor_keyed_by_the_device_runs_at_every_site():
    p = sf.Pipeline("proc")
    flow = readings(p).process(RunningMean, output_schema=MEAN_OUT, id="mean").sink_console(id="o")
    compiled = compile_fragments(flow.spec(), two_sites())
    assert compiled.scopes["mean"] == "local"
    assert compiled.reasons["mean"] == "keyed by device, which is born at one site"
    assert sorted(f.id for f in compiled.fragments) == ["proc.at-a", "proc.at-b"]


def test_a_processor_keyed_by_a_field_that_spans_sites_is_global():
    p = sf.Pipeline("proc")
    flow = (
        readings(p)
        .key_by("reading", id="by_reading")
        .process(RunningMean, output_schema=MEAN_OUT, id="mean")
        .sink_console(id="o")
    )
    compiled = compile_fragments(flow.spec(), two_sites())
    assert compiled.scopes["mean"] == "global"
    assert compiled.reasons["mean"] == "keyed by ['reading'], which may span sites"
    assert "proc.global" in {f.id for f in compiled.fragments}


def test_count_windows_and_running_aggregates_follow_their_key():
    p = sf.Pipeline("cw")
    base = readings(p)
    per_device = base.window(count=10).aggregate(n="count", id="per_device").sink_console(id="o1")
    per_reading = (
        base.key_by("reading", id="by_reading")
        .aggregate(n="count", id="per_reading")
        .sink_console(id="o2")
    )
    scopes = _scopes(per_device.merge(per_reading))
    assert scopes["per_device"] == "local" and scopes["per_reading"] == "global"


def test_a_join_of_two_sites_streams_is_global_and_of_one_sites_is_local():
    topology = Topology.model_validate(
        {
            "sites": [{"name": "a"}, {"name": "b"}, {"name": "cloud", "kind": "cloud"}],
            "nodes": [
                {"name": "ea", "site": "a", "streams": [{"name": "TEMPS"}, {"name": "LOCAL_P"}]},
                {"name": "eb", "site": "b", "streams": [{"name": "PRESSURES"}]},
                {"name": "c1", "site": "cloud"},
            ],
            "links": [{"between": ["a", "cloud"], "latency": "30ms"}],
        }
    )
    schema = {"device": "string", "ts": "timestamp", "x": "double"}
    p = sf.Pipeline("joins")

    def src(stream: str) -> sf.Stream:
        return p.source(stream, schema=schema, event_time="ts", id=stream.lower())

    across = src("TEMPS").join(src("PRESSURES"), on="device", within="5s", id="across")
    at_a = src("TEMPS").join(src("LOCAL_P"), on="device", within="5s", id="at_a")
    scopes = _scopes(across.sink_console(id="o1").merge(at_a.sink_console(id="o2")), topology)
    assert scopes["across"] == "global"
    assert scopes["at_a"] == "local"


def test_enrichment_runs_where_the_records_are():
    p = sf.Pipeline("enrich")
    flow = (
        readings(p)
        .enrich("kv:DEVICES", on="device", schema={"site": "string"}, id="with_site")
        .sink_console(id="o")
    )
    compiled = compile_fragments(flow.spec(), two_sites())
    assert compiled.scopes["with_site"] == "local"
    assert compiled.reasons["with_site"].startswith("looks each record up in the table")


def test_model_steps_are_local_per_device_and_global_for_one_model():
    """Per-key detection, learning and scoring run at the site where the key is born;
    one model for the whole stream needs every site's data."""
    p = sf.Pipeline("ml")
    base = readings(p)
    per_device = (
        base.detect_anomalies("temperature", id="detect")
        .learn(
            "river:linear_model.LogisticRegression",
            features="temperature",
            target="reading",
            id="learn",
        )
        .score("pump", id="score")
        .sink_console(id="o1")
    )
    one_model = (
        base.key_by("reading", id="by_reading")
        .detect_anomalies("temperature", id="detect_all")
        .sink_console(id="o2")
    )
    compiled = compile_fragments(per_device.merge(one_model).spec(), two_sites())
    assert compiled.scopes["detect"] == "local"
    assert compiled.scopes["learn"] == "local"
    assert compiled.scopes["score"] == "local"
    assert compiled.scopes["detect_all"] == "global"


def test_patterns_are_local_per_device_and_global_for_a_key_that_spans_sites():
    """A pattern per device runs at the device's site; keyed by something several
    sites share (a line across two factories) it needs every site's data."""
    p = sf.Pipeline("cep")
    hot = sf.Pattern.begin("hot").where("temperature > 80").followed_by("again").within("1m")
    per_device = readings(p).match(hot, id="per_device").sink_console(id="o1")
    per_line = (
        readings(p).key_by("reading", id="by_line").match(hot, id="per_line").sink_console(id="o2")
    )
    compiled = compile_fragments(per_device.merge(per_line).spec(), two_sites())
    assert compiled.scopes["per_device"] == "local"
    assert compiled.scopes["per_line"] == "global"
