"""examples/seed_on_kafka.py: the seed pipeline between two Kafka topics (3 partitions)
on keyed records: each value plus 1, each key's count averaged per key and 10-second
window, checked value by value, each key's records in the order they came."""

from __future__ import annotations

import importlib.util
from collections import defaultdict
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


def test_seed_pipeline_on_keyed_kafka_records_counts_per_key_and_averages_per_window(
    spark, nats_url, kafka, tmp_path
):
    example = _example()
    start = example.START
    # (key, value, seconds after start): uneven keys, two readings in one second
    readings = [(example.SENSORS[(i * i + i // 4) % 3], 1000.0 + 7 * i, i // 2) for i in range(30)]
    records = [(k, orjson.dumps({"value": v, "time": start + t})) for k, v, t in readings]
    records.insert(5, (example.SENSORS[1], b'"not a number"'))
    records.append((example.SENSORS[2], orjson.dumps({"value": 5.0, "time": start + 99})))
    # Expected, independently of spanflow: each key's k-th reading counts k
    counts: dict[tuple[str, float], list[int]] = defaultdict(list)
    seen: dict[str, int] = defaultdict(int)
    for key, _, t in readings:
        seen[key] += 1
        counts[(key, start + t // 10 * 10)].append(seen[key])
    averages = {kw: sum(c) / len(c) for kw, c in counts.items()}
    plus_one = defaultdict(list)
    for key, v, _ in [*readings, (example.SENSORS[2], 5.0, 99)]:
        plus_one[key].append(v + 1)

    out = example.run_on(
        spark, nats_url, kafka, tmp_path / "cp", records, expect=31 + len(averages)
    )
    got_sums: dict[str, list[float]] = defaultdict(list)
    got_averages: dict[tuple[str, float], float] = {}
    for key, record in out:
        assert record["key"] == key
        if record.get("window_start") is None:
            got_sums[key].append(record["value"])
        else:
            window = _epoch(record["window_start"])
            assert (key, window) not in got_averages, "a window came out twice"
            got_averages[(key, window)] = record["value"]
    # Each key's sums leave on one partition in the order the readings came
    assert got_sums == plus_one
    assert got_averages == averages
    letters = [d for _, d, s in read_all(nats_url, "SPANFLOW_DLQ") if "seed_kafka" in s]
    assert letters == [b'"not a number"']


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
