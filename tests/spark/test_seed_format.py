"""The seed pipeline format (a list of classic processors) runs as is on real Spark."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from spanflow.api import load_pipeline, load_pipeline_text
from spanflow.errors import PipelineFileError
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, read_records, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed_pipeline.yaml"


def test_seed_file_runs_with_running_aggregates_and_a_union_at_the_sink(
    spark, nats_url, checkpoints, uid
):
    source, sink = f"NUMS_{uid}", f"RES_{uid}"
    spec = load_pipeline(EXAMPLE, source_stream=source, sink_stream=sink)
    values = [3, 1.5, "junk", 4, {"value": 2}, {"value": "x"}, 10]
    good = [3.0, 1.5, 4.0, 2.0, 10.0]
    sums = [sum(good[: i + 1]) for i in range(len(good))]
    averages = [(n + 1) / 2 for n in range(1, len(good) + 1)]  # of the counts 1..n
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:  # the runner creates the source stream (capturing the subject of its name)
        publish(nats_url, source, source, [_payload(v) for v in values])
        wait_for(lambda: len(read_all(nats_url, sink)) >= len(sums) + len(averages))
        runner.await_idle()
    finally:
        runner.stop()
    got = Counter(r["value"] for r in read_records(nats_url, sink))
    assert got == Counter(sums) + Counter(averages)
    letters = [d for _, d, s in read_all(nats_url, "SPANFLOW_DLQ") if f"{spec.name}.source" in s]
    assert sorted(letters) == sorted([b'"junk"', b'{"value":"x"}'])


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
    assert [s.type_name for s in spec.steps] == ["source", "sum", "count", "sink"]
