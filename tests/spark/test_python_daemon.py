"""Python task workers run niced; the driver (and a source reader's process, started
by the JVM rather than forked from the daemon) keeps the node's priority."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from spanflow.spark.jvm import python_daemon


def _niceness_of_workers(batches: Iterator[Any]) -> Iterator[Any]:
    import os

    import pyarrow as pa

    for b in batches:
        yield pa.RecordBatch.from_pydict({"nice": pa.array([os.nice(0)] * b.num_rows, pa.int32())})


def test_task_workers_run_niced_below_the_driver(spark: Any) -> None:
    rows = spark.range(0, 2, 1, 2).mapInArrow(_niceness_of_workers, "nice int").collect()
    driver = os.nice(0)
    assert {r.nice for r in rows} == {min(19, driver + python_daemon.NICENESS)}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", python_daemon.NICENESS),
        ("0", 0),
        ("5", 5),
        ("40", 19),
        ("-3", 0),
        ("x", python_daemon.NICENESS),
    ],
)
def test_the_niceness_setting_is_bounded(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: int
) -> None:
    monkeypatch.setenv("SPANFLOW_WORKER_NICENESS", raw)
    assert python_daemon.niceness() == expected
