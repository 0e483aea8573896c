"""Warm Python workers: a node's first batch after a restart or a move is served by
workers that already run, with what its source needs imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from spanflow.runtime.spark_host import keep_python_workers_warm
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]

# In a fresh session of its own (a child process: one SparkContext per process), so the
# workers that serve a job can only be those started before in this script.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from spanflow.spark.session import build_session, warm_python_workers

    MODULE = "tests.spark.warm_probe"  # imported by nothing but the warm-up
    spark = build_session(master="local[2]", app_name="warm-test")

    def probe(batches):
        import pyarrow as pa
        loaded = MODULE in sys.modules  # before this task imports anything
        for _ in batches:
            yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "loaded": [loaded]})

    def served():
        rows = spark.range(0, 2, 1, 2).mapInArrow(probe, "pid long, loaded boolean")
        return sorted([r.pid, r.loaded] for r in rows.collect())

    before = served()
    warm_python_workers(spark, 2, modules=(MODULE,))
    after = served()
    print(json.dumps({"before": before, "after": after}))
    spark.stop()
    """
)


def test_warmed_workers_serve_the_next_tasks_with_the_modules_loaded() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [loaded for _, loaded in seen["before"]] == [False, False]
    assert [loaded for _, loaded in seen["after"]] == [True, True]
    # The same two workers, kept by Spark between the jobs: nothing started anew.
    assert {pid for pid, _ in seen["after"]} <= {pid for pid, _ in seen["before"]}


def test_the_keeper_warms_until_its_node_stops(spark: Any) -> None:
    stop = threading.Event()
    keeper = keep_python_workers_warm(spark, 1, stop, every=0.1, modules=("json",))
    assert keeper.is_alive()
    stop.set()
    keeper.join(timeout=60)
    assert not keeper.is_alive()


def test_an_idle_node_rehearses_a_streaming_query_once(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql.streaming import StreamingQueryListener

    from spanflow.runtime import spark_host

    seen: list[str] = []

    class Watch(StreamingQueryListener):  # notes each query's end
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            seen.append(str(event.id))

    listener = Watch()
    spark.streams.addListener(listener)
    try:
        stop = threading.Event()
        rehearsals: list[Any] = []
        with monkeypatch.context() as m:
            m.setattr("spanflow.spark.session.rehearse_streaming", rehearsals.append)
            busy = spark_host.rehearse_when_idle(spark, lambda: False, stop, after=0.01)
            busy.join(timeout=60)
        assert rehearsals == []  # a node running fragments is warm already
        idle = spark_host.rehearse_when_idle(spark, lambda: True, stop, after=0.01)
        idle.join(timeout=120)
        assert not idle.is_alive()
        wait_for(lambda: len(seen) == 1, timeout=30)  # the rehearsal ran to its end
    finally:
        spark.streams.removeListener(listener)
