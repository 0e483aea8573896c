"""A site that sends nothing no longer holds every merged window open: its fragment's
watermark beats let the cloud's merge close the other sites' windows (real Spark, real
JetStream); the policy that times the beats, without either."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import spanflow as sf
from spanflow.plan.fragments import compile_fragments
from spanflow.spark.query.watermark_beats import (
    BeatPolicy,
    SiteBeats,
    beat_body,
    beat_time,
    is_beat,
)
from spanflow.spark.runner import PipelineRunner
from spanflow.spec.topology import Topology
from tests.helpers import publish, read_records, wait_for

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_caught_up_query_beats_its_watermark_when_it_moves_at_most_every_interval() -> None:
    policy = BeatPolicy(every=5.0, idle_after=30.0)
    assert policy.beat(0.0, T0, T0, caught_up=True) == T0
    assert policy.beat(1.0, T0, T0 + timedelta(seconds=9), caught_up=True) is None  # too soon
    assert policy.beat(6.0, T0, T0 + timedelta(seconds=9), caught_up=True) == T0 + timedelta(
        seconds=9
    )
    assert policy.beat(20.0, T0, T0 + timedelta(seconds=9), caught_up=True) is None  # unmoved
    assert policy.beat(30.0, T0, T0 + timedelta(seconds=20), caught_up=False) is None  # behind


def test_a_query_that_never_saw_event_time_beats_the_wall_clock_once_idle() -> None:
    policy = BeatPolicy(every=5.0, idle_after=30.0)
    wall = T0 + timedelta(hours=1)
    assert policy.beat(0.0, wall, None, caught_up=True) is None
    assert policy.beat(29.0, wall, None, caught_up=True) is None
    assert policy.beat(31.0, wall, None, caught_up=False) is None  # a backlog: not idle
    assert policy.beat(40.0, wall, None, caught_up=True) is None  # caught up again just now
    assert policy.beat(70.0, wall, None, caught_up=True) == wall - timedelta(seconds=30)


def test_a_beat_is_told_apart_from_a_record_and_only_counts_on_a_cut_subject() -> None:
    body = beat_body(T0)
    cut = "spanflow.cut.p.per_10s.edge-a"
    assert is_beat(cut, body) and beat_time(body) == T0.isoformat()
    assert not is_beat(cut, b'{"device": "d1", "_watermark": "x"}')
    # a device forging a beat on its own subject sends a record: no watermark moves
    assert not is_beat("plant.edge-a.press-7.temp", beat_body(T0 + timedelta(days=3650)))
    assert beat_time(b"not json") is None


def _pipeline(uid: str) -> sf.Flow:
    p = sf.Pipeline(f"quiet-{uid}", trigger="0.5s")
    return (
        p.source(
            f"QIN_{uid}",
            subjects=[f"qin{uid}.>"],
            schema={"device": "string", "ts": "timestamp"},
            event_time="ts",
            max_out_of_orderness="2s",
            id="readings",
        )
        .key_by("device", id="by_device")
        .window(tumbling="10s")
        .aggregate(n="count", id="per_10s")
        .sink_jetstream(f"QOUT_{uid}", subject=f"qout{uid}.{{device}}", id="out")
    )


def _topology(uid: str) -> Topology:
    return Topology.model_validate(
        {
            "sites": [{"name": "a"}, {"name": "b"}, {"name": "cloud", "kind": "cloud"}],
            "nodes": [
                {"name": f"e{s}", "site": s,
                 "streams": [{"name": f"QIN_{uid}", "subjects": [f"qin{uid}.{s}.>"]}]}
                for s in ("a", "b")
            ] + [{"name": "c1", "site": "cloud"}],
        }
    )  # fmt: skip


@pytest.mark.slow
def test_windows_of_one_site_close_in_the_cloud_while_the_other_sends_nothing(
    spark: Any, nats_url: str, checkpoints: Any, uid: str
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(seconds=now.timestamp() % 10 + 120)  # a window start, 2 min ago
    readings = [
        {"device": "d1", "ts": (start + timedelta(seconds=i)).isoformat()} for i in range(30)
    ]
    # far ahead: closes every real window at site a (the edge's own watermark moves on)
    readings.append({"device": "d1", "ts": (now + timedelta(hours=1)).isoformat()})
    publish(nats_url, f"QIN_{uid}", f"qin{uid}.a.r", readings)

    fragments = compile_fragments(_pipeline(uid).spec(), _topology(uid)).fragments
    assert [f.id.rsplit(".", 1)[1] for f in fragments] == ["at-a", "at-b", "global"]
    runners = [
        PipelineRunner(spark, f.spec, nats_url=nats_url, checkpoint_dir=checkpoints, plan=f.plan)
        for f in fragments
    ]
    for r in runners:
        r.beats = SiteBeats(idle_after=5.0)  # the 30-s default, shortened for the test
    try:
        for r in runners:
            r.start()

        def windows() -> Counter[str]:
            for r in runners:
                r.supervise()  # as the node agent does: restarts, beats
            try:
                found = read_records(nats_url, f"QOUT_{uid}")
            except Exception:  # no window yet: the sink's stream is made with the first
                found = []
            return Counter({str(w["window_start"])[:19]: int(w["n"]) for w in found})

        expected = Counter(
            {(start + timedelta(seconds=s)).isoformat()[:19]: 10 for s in (0, 10, 20)}
        )
        wait_for(lambda: all(windows()[k] == 10 for k in expected), timeout=240)
        got = windows()
        assert {k: got[k] for k in expected} == expected
        assert sum(got.values()) == 30, got  # each window once, the far one still open
    finally:
        for r in runners:
            r.stop()
