"""The seed pipeline format (a list of classic processors) runs as is on real Spark."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import pytest

from spanflow.api import load_pipeline, load_pipeline_text
from spanflow.errors import MeaningChanged, PipelineFileError
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, read_records, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed_pipeline.yaml"


T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, on a 10-second boundary


def test_seed_file_adds_counts_per_key_and_averages_per_window(spark, nats_url, checkpoints, uid):
    """The example file as the format says: ``sum`` adds 1 to each value, ``count`` counts
    each key's records, ``average`` averages them per key and 10-second window; the
    union at the sink takes both. Checked value by value."""
    source, sink = f"NUMS_{uid}", f"RES_{uid}"
    spec = load_pipeline(EXAMPLE, source_stream=source, sink_stream=sink)
    readings = [  # (key, value, seconds after T0)
        ("a", 3, 1),
        ("b", 1.5, 2),
        ("a", 4, 3),
        ("a", 2, 12),
        ("b", 10, 13),
    ]
    values: list[object] = [{"key": k, "value": v, "time": T0 + t} for k, v, t in readings]
    values[2:2] = ["junk", {"value": "x", "key": "a", "time": T0 + 2}]
    values.append(42)  # no key, no time: stored now, which closes every window above
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:  # the runner creates the source stream (capturing the subject of its name)
        publish(nats_url, source, source, [_payload(v) for v in values])
        wait_for(lambda: len(read_all(nats_url, sink)) >= len(readings) + 1 + 4)
        runner.await_idle()
    finally:
        runner.stop()
    out = read_records(nats_url, sink)
    sums = sorted(r["value"] for r in out if r.get("window_start") is None)
    assert sums == sorted([v + 1 for _, v, _ in readings] + [43.0])
    averages = {
        (r["key"], r["window_start"][11:19]): r["value"] for r in out if r.get("window_start")
    }
    # a's counts 1, 2 in [0 s, 10 s) and 3 in [10 s, 20 s); b's 1 and 2
    assert averages == {
        ("a", "00:00:00"): 1.5,
        ("b", "00:00:00"): 1.0,
        ("a", "00:00:10"): 3.0,
        ("b", "00:00:10"): 2.0,
    }
    letters = [d for _, d, s in read_all(nats_url, "SPANFLOW_DLQ") if f"{spec.name}.source" in s]
    assert len(letters) == 2 and b'"junk"' in letters


def _payload(value: object) -> bytes:
    import orjson

    return orjson.dumps(value)


def test_seed_file_errors_name_the_line_and_field():
    text = EXAMPLE.read_text().replace("to: [avg]", "to: [avgg]")
    with pytest.raises(PipelineFileError) as info:
        load_pipeline_text(text, "p.yaml", source_stream="S", sink_stream="T")
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "to: [avgg]" in t)
    assert f"p.yaml:{line}: [2].to: unknown processor 'avgg'" in str(info.value)


def test_seed_file_without_streams_says_which_options_to_give():
    with pytest.raises(PipelineFileError, match=r"--source-stream .* --sink-stream"):
        load_pipeline_text(EXAMPLE.read_text(), "p.yaml")


def test_seed_file_with_a_bad_parameter_is_located():
    text = "- {id: a, type: sum, valeu: 3, to: [sink]}\n"
    with pytest.raises(PipelineFileError) as info:
        load_pipeline_text(text, "p.yaml", source_stream="S", sink_stream="T")
    assert "p.yaml:1: [0].valeu: Extra inputs are not permitted" in str(info.value)


def test_seed_processors_keep_spanflow_parameters():
    text = (
        "- {id: plus, type: sum, field: value, value: 10, to: [per_key]}\n"
        "- {id: per_key, type: count, key: value, to: [sink]}\n"
    )
    spec = load_pipeline_text(text, "p.yaml", source_stream="S", sink_stream="T")
    assert [s.type_name for s in spec.steps] == ["source", "map", "sum", "count", "sink"]


def test_running_aggregates_keep_their_own_names_and_run_on_spark(
    spark, nats_url, checkpoints, uid
):
    """running_sum/_count/_average: the aggregates of the whole stream that spanflow 0.1
    ran for a bare sum, count and average."""
    text = (
        "- {id: total, type: running_sum, to: [sink]}\n"
        "- {id: n, type: running_count, to: [mean]}\n"
        "- {id: mean, type: running_average, to: [sink]}\n"
    )
    source, sink = f"NUMS_{uid}", f"RES_{uid}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no word about changed meanings here
        spec = load_pipeline_text(text, "p.yaml", source_stream=source, sink_stream=sink)
    good = [3.0, 1.5, 4.0, 1000.0]
    sums = [sum(good[: i + 1]) for i in range(len(good))]
    averages = [(n + 1) / 2 for n in range(1, len(good) + 1)]  # of the counts 1..n
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        publish(nats_url, source, source, [_payload(v) for v in good])
        wait_for(lambda: len(read_all(nats_url, sink)) >= len(sums) + len(averages))
        runner.await_idle()
    finally:
        runner.stop()
    got = Counter(r["value"] for r in read_records(nats_url, sink))
    assert got == Counter(sums) + Counter(averages)


def test_a_bare_classic_processor_warns_that_its_meaning_changed_with_its_line():
    text = EXAMPLE.read_text()
    with pytest.warns(MeaningChanged) as caught:
        load_pipeline_text(text, "p.yaml", source_stream="S", sink_stream="T")
    (message,) = [str(w.message) for w in caught]
    lines = text.splitlines()
    for kind, running in (("sum", "running_sum"), ("count", "running_count")):
        line = next(n for n, t in enumerate(lines, 1) if t.strip() == f"type: {kind}")
        assert f"p.yaml:{line}: " in message and f"type: {running}" in message
    explicit = "- {id: plus, type: sum, value: 1, to: [sink]}\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_pipeline_text(explicit, "p.yaml", source_stream="S", sink_stream="T")
