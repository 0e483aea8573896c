"""One query at a time through source initialisation (the waiting is pure; a real
query's status is read from Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spanflow.spark.query import source_starts


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_a_start_waits_while_another_query_initialises_its_sources() -> None:
    clock, answers = _Clock(), iter([True, True, True, False])
    quiet = source_starts.wait_until_quiet(
        5.0, is_busy=lambda: next(answers), sleep=clock.sleep, clock=clock.now
    )
    assert quiet and 0.25 < clock.t < 0.35


def test_a_start_waits_no_longer_than_its_timeout() -> None:
    clock = _Clock()
    quiet = source_starts.wait_until_quiet(
        2.0, is_busy=lambda: True, sleep=clock.sleep, clock=clock.now
    )
    assert not quiet and 2.0 <= clock.t < 2.2


def test_a_query_past_its_sources_or_stopped_is_not_in_the_way(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"v": 1}\n')
    query = (
        spark.readStream.schema("v long")
        .json(str(tmp_path / "in"))
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    source_starts.started(query)
    try:
        query.processAllAvailable()
        assert query.status["message"] != source_starts.INITIALIZING
        assert not source_starts.busy()
    finally:
        query.stop()
    assert not source_starts.is_initializing(query)
