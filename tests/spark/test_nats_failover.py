"""A NATS server's death under a running pipeline: the streams and the bucket it led
elect new leaders (4 to 9 s), and the pipeline waits the election out instead of
failing its queries — no query restarts (a restart costs seconds more than the
election), every reading once, every window exact.

Three servers, a fenced runner (as on a cluster node) whose source stream, sink
streams and fences bucket have three copies; SIGKILL the server leading each in turn,
restarting it in between."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.nats.fences import Fence
from spanflow.nats.server import NatsCluster
from spanflow.nats.streams import SyncNats
from spanflow.spark.runner import PipelineRunner
from spanflow.spec.retention import Retention
from tests.cluster.test_chaos import PIPELINE  # events and 2-s windows, streams CH_*
from tests.helpers import (
    Feed,
    all_copies_current,
    assert_feed_exactly_once,
    stored,
    stream_leader,
    supervising,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.solo]  # output-pause and takeover bounds


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path / "nats", 3) as cluster:
        wait_for(lambda: _three_copies_possible(cluster.url), timeout=90)
        yield cluster


def _three_copies_possible(url: str) -> bool:
    """True once the cluster can create (and delete) a stream with three replicas:
    JetStream's meta leader elected and every peer known to it. Until then the
    pipeline's own streams may fail to be created, which is not what this test tests."""
    client = SyncNats(url)
    try:
        client.run(
            lambda: client.js.add_stream(name="PROBE", subjects=["probe.x"], num_replicas=3),
            timeout=5,
        )
        client.run(lambda: client.js.delete_stream("PROBE"), timeout=5)
        return True
    except Exception:
        return False
    finally:
        client.close()


def test_a_pipeline_waits_out_each_election_without_restarting_a_query(
    spark: Any, nats: NatsCluster, tmp_path: Path
) -> None:
    url = nats.url
    feed = Feed(url, "CH_IN", "chin", replicas=3)
    spec = load_pipeline_text(PIPELINE)
    checkpoints = tmp_path / "ckpt"
    fence = Fence("chaos.f0", 1, "n1", str(checkpoints))
    runner = PipelineRunner(
        spark,
        spec,
        nats_url=url,
        checkpoint_dir=checkpoints,
        retention=Retention(replicas=3),
        fence=fence,
    ).start()
    try:
        with supervising(runner):
            stall = _kill_each_leader(nats, url)
        sent = feed.stop()
        assert_feed_exactly_once(url, "CH_EVENTS", "CH_WINDOWS", sent)
        restarts = {sid: sup.restarts for sid, sup in runner._queries.items()}
        print(f"output again after each leader's kill: {stall}; restarts {restarts}")
        assert restarts == {"events": 0, "windows": 0}
        assert max(stall.values()) < 20.0  # election ≤ 9.8 s; no restart, so no more
    finally:
        feed.stop()
        runner.stop()


def _kill_each_leader(nats: NatsCluster, url: str) -> dict[str, float]:
    """SIGKILL the server leading the events sink, the source stream and the fences
    bucket in turn (each restarted once the output moved on); seconds from each kill
    until 100 more readings were stored."""

    def progress(after: int) -> float:
        """Seconds until the events sink holds ``after`` + 100 readings."""
        started = time.monotonic()
        wait_for(lambda: stored(url, "CH_EVENTS") > after + 100, timeout=90)
        return time.monotonic() - started

    progress(0)
    stall: dict[str, float] = {}
    for led in ("CH_EVENTS", "CH_IN", "KV_spanflow_fences"):
        # One server's death at a time: every copy of what the pipeline uses is current
        # again (the server restarted last caught up) before the next kill.
        for stream in ("CH_EVENTS", "CH_WINDOWS", "CH_IN", "KV_spanflow_fences"):
            wait_for(lambda s=stream: all_copies_current(url, s), timeout=90)  # type: ignore[misc]
        victim = stream_leader(url, led)
        assert victim is not None
        before = stored(url, "CH_EVENTS")
        nats.servers[victim].kill()
        stall[led] = round(progress(before), 1)
        nats.restart(victim)
    return stall
