"""Which steps of a new pipeline version keep the old version's state (pure)."""

from __future__ import annotations

import pytest

import spanflow as sf
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.upgrade import (
    UpgradeRefused,
    Verdict,
    can_name_sources,
    check_upgrade,
    stateful_steps,
)

SCHEMA = {"device": "string", "ts": "timestamp", "t": "double", "p": "double"}
HOT = sf.Pattern.begin("hot").where("t > 80").followed_by("drop").where("p < 2").within("30s")


def _version(
    *,
    threshold: float = 0.9,
    size: str = "10s",
    aggregates: dict[str, str] | None = None,
    pattern: sf.Pattern = HOT,
    extra_sink: bool = False,
    second_source: bool = False,
    key: str = "device",
) -> PipelineSpec:
    flow = sf.Pipeline("plant")
    src = flow.source("IN", schema=SCHEMA, key="device", event_time="ts", id="readings")
    keyed = src.key_by(key, id="keyed")
    if second_source:
        keyed = keyed.union(
            flow.source("MORE", schema=SCHEMA, key="device", event_time="ts", id="more")
        )
    windows = keyed.window(tumbling=size).aggregate(id="per_10s", **(aggregates or {"n": "count"}))
    scored = src.detect_anomalies("t", method="robust", threshold=threshold, id="scored")
    matches = src.match(pattern, id="overheat")
    out = (
        windows.sink_jetstream("W", subject="w", id="windows_out")
        .merge(scored.sink_jetstream("S", subject="s", id="scores_out"))
        .merge(matches.sink_jetstream("M", subject="m", id="matches_out"))
    )
    if extra_sink:
        sums = src.key_by("device").window(tumbling="1m").aggregate(id="per_minute", top="max(t)")
        out = out.merge(sums.sink_jetstream("X", subject="x", id="minutes_out"))
    return out.spec()


def _verdicts(old: PipelineSpec, new: PipelineSpec) -> dict[tuple[str, str], Verdict]:
    return {(s.sink, s.step): s.verdict for s in check_upgrade(old, new).steps}


def test_the_same_version_keeps_every_stateful_step():
    report = check_upgrade(_version(), _version())
    assert report.ok
    assert {s.step for s in report.steps} == {"per_10s", "scored", "overheat"}
    assert {s.verdict for s in report.steps} == {Verdict.KEPT}


def test_each_sinks_query_names_the_stateful_steps_its_checkpoint_holds():
    spec = _version(extra_sink=True)
    assert stateful_steps(spec, "windows_out") == ["per_10s"]
    assert stateful_steps(spec, "minutes_out") == ["per_minute"]
    assert stateful_steps(spec, "scores_out") == ["scored"]


def test_a_changed_detector_threshold_keeps_the_models():
    report = check_upgrade(_version(threshold=0.9), _version(threshold=0.5))
    (scored,) = [s for s in report.steps if s.step == "scored"]
    assert scored.verdict == Verdict.CHANGED
    assert "threshold 0.9 → 0.5" in scored.detail
    assert report.ok


def test_a_threshold_of_another_kind_is_a_change_of_state():
    flow = sf.Pipeline("plant").source("IN", schema=SCHEMA, key="device", id="readings")

    def spec(threshold: float | str) -> PipelineSpec:
        scored = flow.detect_anomalies("t", method="robust", threshold=threshold, id="scored")
        return scored.sink_jetstream("S", subject="s", id="out").spec()

    (step,) = check_upgrade(spec(0.9), spec("quantile(0.99)")).refused
    assert "threshold kind 'static' → 'quantile'" in step.detail


def test_an_added_aggregate_on_a_sink_of_its_own_starts_empty_and_the_rest_is_kept():
    verdicts = _verdicts(_version(), _version(extra_sink=True))
    assert verdicts.pop(("minutes_out", "per_minute")) == Verdict.ADDED
    assert set(verdicts.values()) == {Verdict.KEPT}


def test_an_added_pattern_stage_keeps_the_query():
    longer = HOT.followed_by("calm").where("t < 50")
    report = check_upgrade(_version(), _version(pattern=longer))
    assert report.ok
    (step,) = [s for s in report.steps if s.step == "overheat"]
    assert step.verdict == Verdict.CHANGED and "pattern" in step.detail


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"size": "1m"}, "size '10s' → '1m': it shapes its state"),
        ({"aggregates": {"n": "count", "top": "max(t)"}}, "aggregates"),
        ({"key": "ts"}, "key ['device'] → ['ts']"),
        ({"second_source": True}, "Spark keeps one offset per source of a query"),
    ],
)
def test_a_change_to_what_a_window_keeps_is_refused_with_the_step_and_field(change, reason):
    report = check_upgrade(_version(), _version(**change))
    assert not report.ok
    assert {(s.sink, s.step) for s in report.refused} == {("windows_out", "per_10s")}
    assert reason in report.refused[0].detail
    # the other sinks' queries are not touched by it
    others = {s.verdict for s in report.steps if s.sink != "windows_out"}
    assert others == {Verdict.KEPT}
    with pytest.raises(UpgradeRefused, match="sink 'windows_out', step 'per_10s': refused"):
        report.raise_if_refused("plant")


def test_a_stateful_step_added_inside_a_query_is_refused():
    flow = sf.Pipeline("p")
    src = flow.source("IN", schema=SCHEMA, key="device", event_time="ts", id="readings")
    old = src.detect_anomalies("t", method="robust", id="scored").sink_jetstream(
        "S", subject="s", id="out"
    )
    new = (
        src.deduplicate("device", "ts", within="1m", id="once")
        .detect_anomalies("t", method="robust", id="scored")
        .sink_jetstream("S", subject="s", id="out")
    )
    refused = check_upgrade(old.spec(), new.spec()).refused
    assert {s.step for s in refused} == {"once", "scored"}
    assert "adds ['once'] stateful steps" in refused[0].detail


def test_a_removed_sink_drops_its_state_and_a_sink_without_state_is_not_checked():
    verdicts = _verdicts(_version(extra_sink=True), _version())
    assert verdicts.pop(("minutes_out", "per_minute")) == Verdict.DROPPED
    assert set(verdicts.values()) == {Verdict.KEPT}
    # a sink whose query never ran has no state to keep
    report = check_upgrade(_version(), _version(size="1m"), running={"scores_out"})
    assert report.ok
    assert {s.verdict for s in report.steps if s.sink == "windows_out"} == {Verdict.ADDED}


def test_a_source_reading_another_stream_cannot_resume_its_offsets():
    def spec(stream: str) -> PipelineSpec:
        src = sf.Pipeline("p").source(stream, schema=SCHEMA, key="device", id="readings")
        return src.detect_anomalies("t", id="scored").sink_jetstream("S", subject="s").spec()

    (step,) = check_upgrade(spec("IN"), spec("OTHER")).refused
    assert "source 'readings': stream 'IN' → 'OTHER'" in step.detail


def test_a_stateful_query_switched_to_real_time_is_refused():
    def spec(mode: str) -> PipelineSpec:
        src = sf.Pipeline("p", mode=mode).source("IN", schema=SCHEMA, event_time="ts", id="r")
        windows = src.window(tumbling="10s").aggregate(n="count", emit="updates", id="w")
        return windows.sink_jetstream("O", subject="o", id="out").spec()

    (step,) = check_upgrade(spec("microbatch"), spec("realtime")).refused
    assert "ran in microbatch mode and would run in realtime mode" in step.detail


def _sites(*sites: str) -> PipelineSpec:
    """A global fragment's shape: one source per site, a union, a window per device."""
    flow = sf.Pipeline("plant")
    sources = [
        flow.source("CUT", schema=SCHEMA, key="device", event_time="ts", id=f"from_{s}")
        for s in sites
    ]
    merged = sources[0].union(*sources[1:]) if len(sources) > 1 else sources[0]
    windows = merged.key_by("device").window(tumbling="10s").aggregate(n="count", id="per_10s")
    return windows.sink_jetstream("W", subject="w", id="windows_out").spec()


def test_a_query_keeping_offsets_by_name_takes_a_new_site_in_and_keeps_its_windows():
    report = check_upgrade(_sites("a", "b"), _sites("a", "b", "c"), named={"windows_out"})
    assert report.ok
    verdicts = {(s.step, s.verdict) for s in report.steps}
    assert verdicts == {("from_c", Verdict.ADDED), ("per_10s", Verdict.KEPT)}


def test_a_query_keeping_offsets_by_name_lets_a_site_go():
    report = check_upgrade(_sites("a", "b", "c"), _sites("a", "c"), named={"windows_out"})
    assert {(s.step, s.verdict) for s in report.steps} == {
        ("from_b", Verdict.DROPPED),
        ("per_10s", Verdict.KEPT),
    }


def test_a_query_keeping_offsets_by_position_cannot_take_a_new_source():
    (step,) = check_upgrade(_sites("a", "b"), _sites("a", "b", "c")).refused
    assert step.step == "per_10s"
    assert "by position" in step.detail and "start the pipeline anew once" in step.detail


def test_a_named_source_reading_another_stream_is_still_refused():
    def spec(stream: str) -> PipelineSpec:
        src = sf.Pipeline("p").source(stream, schema=SCHEMA, key="device", id="readings")
        return src.detect_anomalies("t", id="scored").sink_jetstream("S", subject="s").spec()

    (step,) = check_upgrade(spec("IN"), spec("OTHER"), named={"sink"}).refused
    assert "source 'readings': stream 'IN' → 'OTHER'" in step.detail


def _two_paths() -> PipelineSpec:
    """One source read by two branches that meet again (the seed format's forward)."""
    src = sf.Pipeline("p").source("IN", schema=SCHEMA, key="device", id="readings")
    hot, cold = src.filter("t > 30", id="hot"), src.filter("t < 0", id="cold")
    windows = hot.union(cold).window(tumbling="10s").aggregate(n="count", id="per_10s")
    return windows.sink_jetstream("W", subject="w", id="windows_out").spec()


def test_a_query_reading_a_source_by_two_paths_cannot_name_it():
    assert can_name_sources(_sites("a", "b"), "windows_out")
    assert not can_name_sources(_two_paths(), "windows_out")
    realtime = sf.Pipeline("p", mode="realtime").source("IN", schema=SCHEMA, id="readings")
    assert not can_name_sources(realtime.sink_jetstream("S", subject="s").spec(), "sink")


def test_a_query_keeping_offsets_by_name_cannot_grow_a_second_path_to_a_source():
    one = sf.Pipeline("p").source("IN", schema=SCHEMA, key="device", id="readings")
    windows = one.window(tumbling="10s").aggregate(n="count", id="per_10s")
    old = windows.sink_jetstream("W", subject="w", id="windows_out").spec()
    (step,) = check_upgrade(old, _two_paths(), named={"windows_out"}).refused
    assert step.step == "per_10s" and "by two paths" in step.detail
    assert check_upgrade(old, _two_paths()).ok  # by position: same sources, same windows
