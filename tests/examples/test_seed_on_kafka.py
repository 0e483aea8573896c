"""examples/seed_on_kafka.py: the seed pipeline between two Kafka topics (3 partitions)
gives every running sum and average once, each key's records in the order they came."""

from __future__ import annotations

import importlib.util
from collections import Counter, defaultdict
from pathlib import Path

import orjson

from tests.helpers import read_all

PATH = Path(__file__).resolve().parents[2] / "examples" / "seed_on_kafka.py"


def _example():
    spec = importlib.util.spec_from_file_location("seed_on_kafka", PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_seed_pipeline_runs_between_kafka_topics_in_key_order(spark, nats_url, kafka, tmp_path):
    example = _example()
    n = 30
    # Values from 1000 up: running sums (>= 1000) cannot be taken for running averages of
    # the count (<= n)
    values = [1000.0 + 7 * i for i in range(n)]
    records = [
        (example.SENSORS[i % 3], orjson.dumps(v if i % 2 else {"value": v}))
        for i, v in enumerate(values)
    ]
    records.append((example.SENSORS[0], b'"not a number"'))
    out = example.run_on(spark, nats_url, kafka, tmp_path / "cp", records)
    averages = [r["value"] for _, r in out if r["value"] < 1000]
    sums = [r["value"] for _, r in out if r["value"] >= 1000]
    # Averages of the running count 1..k are (k + 1) / 2 whatever the order
    assert Counter(averages) == Counter((k + 1) / 2 for k in range(1, n + 1))
    # The running sums, in the order they were taken, add each value exactly once
    ordered = sorted(sums)
    steps = [b - a for a, b in zip([0.0, *ordered], ordered, strict=False)]
    assert Counter(steps) == Counter(values)
    # Each key's records leave on one partition in the order they came: for each key,
    # its sums and its averages only grow along the output topic
    by_key: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, record in out:
        assert record["key"] == key
        kind = "sum" if record["value"] >= 1000 else "avg"
        by_key[key][kind].append(record["value"])
    assert set(by_key) == set(example.SENSORS)
    for series in by_key.values():
        assert all(s == sorted(s) for s in series.values())
    letters = [d for _, d, s in read_all(nats_url, "SPANFLOW_DLQ") if "seed_kafka" in s]
    assert letters == [b'"not a number"']
