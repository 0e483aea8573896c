"""A new version of a pipeline starts on the old one's checkpoints with the state it can
keep (real Spark and NATS), and a version that cannot keep it is refused before any of
its queries starts."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import pytest

import spanflow as sf
from spanflow.spark.checkpoints.versions import VERSION_FILE, record_version
from spanflow.spark.runner import PipelineRunner
from spanflow.spec.upgrade import UpgradeRefused
from tests.helpers import publish, read_records, wait_for

T0 = 1_800_000_000  # on a 10-second boundary
SCHEMA = {"id": "long", "device": "string", "ts": "timestamp", "t": "double"}


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat()


HOT_COOL = sf.Pattern.begin("hot").where("t > 80").followed_by("cool").where("t < 30")


def _version(uid: str, *, threshold: float, size: str = "10s", more: bool = False) -> sf.Flow:
    src = sf.Pipeline(f"upg-{uid}", trigger=0).source(
        f"IN_{uid}", schema=SCHEMA, key="device", event_time="ts", id="readings"
    )
    windows = src.window(tumbling=size).aggregate(n="count", ids="sum(id)", id="per_10s")
    scored = src.detect_anomalies("t", method="robust", warmup=10, threshold=threshold, id="score")
    # v2 appends a stage to the pattern
    pattern = HOT_COOL.followed_by("calm").where("t < 25") if more else HOT_COOL
    matches = src.filter("device = 'p'").match(pattern.within("60s"), rule="heat", id="heat")
    flow = (
        windows.sink_jetstream(f"W_{uid}", subject=f"w{uid}", id="windows_out")
        .merge(scored.sink_jetstream(f"S_{uid}", subject=f"s{uid}", id="scores_out"))
        .merge(matches.sink_jetstream(f"M_{uid}", subject=f"m{uid}", id="matches_out"))
    )
    if more:  # an added aggregate, on a sink of its own
        peaks = src.window(tumbling="10s").aggregate(top="max(t)", id="peaks")
        flow = flow.merge(peaks.sink_jetstream(f"X_{uid}", subject=f"x{uid}", id="peaks_out"))
    return flow


def _windows(nats_url: str, stream: str) -> dict[tuple[str, float], dict]:
    """(device, window start) → the window's row, each written once."""
    out: dict[tuple[str, float], dict] = {}
    for r in read_records(nats_url, stream):
        start = datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp()
        at = (r["device"], start - T0)
        assert at not in out, f"window {at} written twice"
        out[at] = r
    return out


def test_an_upgrade_keeps_window_state_and_detector_models_and_refuses_a_changed_window(
    spark, nats_url, checkpoints, uid
):
    readings = [
        {"id": i, "device": "a", "ts": _at(i * 0.2), "t": 20.0 + (i % 5) * 0.1}
        for i in range(1, 31)
    ] + [{"id": 201, "device": "p", "ts": _at(2), "t": 90.0}]  # a pattern's first stage
    v1 = _version(uid, threshold=0.99).spec()
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", readings)  # the source stream exists
    runner = PipelineRunner(spark, v1, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        wait_for(lambda: len(read_records(nats_url, f"S_{uid}")) == len(readings))
        runner.await_idle()
    finally:
        runner.stop()
    assert _windows(nats_url, f"W_{uid}") == {}  # [0, 10) is still open in the state

    # a window of another size cannot take the old windows' state: refused, nothing runs
    wider = _version(uid, threshold=0.5, size="1m").spec()
    refused = PipelineRunner(spark, wider, nats_url=nats_url, checkpoint_dir=checkpoints)
    with pytest.raises(UpgradeRefused, match=r"step 'per_10s': refused .*size '10s' → '1m'"):
        refused.start()
    assert not [q for q in spark.streams.active if q.name and uid in q.name]
    stored = orjson.loads((checkpoints / v1.instance / "windows_out" / VERSION_FILE).read_bytes())
    assert stored["steps"][1]["size"] == "10s"  # the old version's, untouched

    # a changed threshold and an added aggregate: the old state carries on
    v2 = _version(uid, threshold=0.5, more=True).spec()
    runner = PipelineRunner(spark, v2, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        spike = {"id": 100, "device": "a", "ts": _at(7), "t": 500.0}
        clock = {"id": 1000, "device": "b", "ts": _at(25), "t": 20.0}
        cool = {"id": 202, "device": "p", "ts": _at(8), "t": 28.0}
        calm = {"id": 203, "device": "p", "ts": _at(9), "t": 20.0}
        publish(nats_url, f"IN_{uid}", f"in{uid}.r", [spike, cool, calm])
        wait_for(lambda: any(r["id"] == 100 for r in read_records(nats_url, f"S_{uid}")))
        publish(nats_url, f"IN_{uid}", f"in{uid}.r", [clock])
        wait_for(lambda: ("p", 0.0) in _windows(nats_url, f"W_{uid}"))
        wait_for(lambda: ("a", 0.0) in _windows(nats_url, f"X_{uid}"))
        wait_for(lambda: read_records(nats_url, f"M_{uid}"))
        runner.await_idle()
    finally:
        runner.stop()
    # the new version went on from the old one's offsets: every reading scored once
    scores = read_records(nats_url, f"S_{uid}")
    assert sorted(r["id"] for r in scores) == [*range(1, 31), 100, 201, 202, 203, 1000]
    # the window open across the upgrade counts the records of both versions, once each
    windows = _windows(nats_url, f"W_{uid}")
    assert (windows["a", 0.0]["n"], windows["a", 0.0]["ids"]) == (31, sum(range(1, 31)) + 100)
    assert (windows["p", 0.0]["n"], windows["p", 0.0]["ids"]) == (3, 201 + 202 + 203)
    # the spike is the key's 31st reading: past the warm-up, so the kept model flags it
    # (a model started afresh would be warming up on it)
    (scored,) = [r for r in scores if r["id"] == 100]
    assert scored["is_anomaly"] is True
    # the added aggregate's query started empty and read the stream from its start
    assert _windows(nats_url, f"X_{uid}")["a", 0.0]["top"] == 500.0
    # the pattern's partial match from v1 (hot at 2 s) completes with v2's new stage
    (match,) = read_records(nats_url, f"M_{uid}")
    assert (match["match_start"][:19], match["match_end"][:19]) == (_at(2)[:19], _at(9)[:19])
    assert (match["hot_count"], match["cool_count"], match["calm_count"]) == (1, 1, 1)


def test_a_restart_of_the_same_version_leaves_its_version_files_unwritten(tmp_path):
    """The version file is written when the version changes, not on every start (on
    ``jetstream://`` or S3 each write is a round trip). Local paths need no session."""
    v1, v2 = _version("rv", threshold=0.9).spec(), _version("rv", threshold=0.5).spec()
    no_session = cast(Any, None)
    record_version(no_session, str(tmp_path), v1)
    files = sorted(tmp_path.glob(f"*/{VERSION_FILE}"))
    assert [f.parent.name for f in files] == sorted(s.id for s in v1.sinks())
    first = {f: f.stat().st_mtime_ns for f in files}
    for f in files:  # an old timestamp that a rewrite would replace
        os.utime(f, ns=(1_000_000_000, 1_000_000_000))
    record_version(no_session, str(tmp_path), v1)
    assert all(f.stat().st_mtime_ns == 1_000_000_000 for f in files), first
    record_version(no_session, str(tmp_path), v2)
    assert all(f.stat().st_mtime_ns != 1_000_000_000 for f in files)
    stored = orjson.loads(files[0].read_bytes())
    assert any(s.get("threshold") == 0.5 for s in stored["steps"])
