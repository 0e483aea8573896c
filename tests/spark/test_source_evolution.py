"""A query that keeps its offsets by source name takes a new source in without losing
its state (real Spark, real JetStream): a global fragment's shape — one source per site
on one cut stream, a union, a window per device — runs for sites a and b, stops with a
window open, and goes on reading a, b and c from the same checkpoint. The open window
counts every reading of all three sites once; windows already written are not written
again. A checkpoint kept by position refuses the same change before anything starts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.spark.checkpoints import source_names
from spanflow.spark.checkpoints.source_names import offset_log_version, source_name
from spanflow.spark.runner import PipelineRunner
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.upgrade import UpgradeRefused
from tests.helpers import publish, read_records, wait_for

T0 = 1_800_000_000  # on a 10-second boundary


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat()


def _global(uid: str, sites: tuple[str, ...]) -> PipelineSpec:
    sources = "\n".join(
        f"""  - id: from_{site}
    stream: CUT_{uid}
    subjects: ["cut{uid}.>"]
    filter_subjects: ["cut{uid}.{site}"]
    schema: {{id: long, device: string, ts: timestamp}}
    event_time: ts
    to: [merged]"""
        for site in sites
    )
    return load_pipeline_text(f"""
name: evo-{uid}
trigger: 0s
sources:
{sources}
processors:
  - {{id: merged, type: union, to: [keyed]}}
  - {{id: keyed, type: key_by, key: device, to: [per_10s]}}
  - id: per_10s
    type: window
    tumbling: 10s
    aggregates: {{n: count, ids: sum(id)}}
    to: [windows_out]
sinks:
  - {{id: windows_out, type: jetstream, stream: W_{uid}, subject: "w{uid}"}}
""")


def _reading(uid: str, site: str, i: int, at: float) -> tuple[str, dict]:
    return f"cut{uid}.{site}", {"id": i, "device": "d", "ts": _at(at)}


def _send(nats_url: str, uid: str, readings: list[tuple[str, dict]]) -> None:
    for subject, body in readings:
        publish(nats_url, f"CUT_{uid}", subject, [body])


def _windows(nats_url: str, uid: str) -> dict[float, tuple[int, int]]:
    out: dict[float, tuple[int, int]] = {}
    for r in read_records(nats_url, f"W_{uid}"):
        start = datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp() - T0
        assert start not in out, f"window {start} written twice"
        out[start] = (r["n"], r["ids"])
    return out


def _run_until(spark, nats_url: str, checkpoints: Path, spec: PipelineSpec, done) -> None:
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        wait_for(lambda: (runner.supervise(), done())[1], timeout=180)
        runner.await_idle()
    finally:
        runner.stop()


def test_a_third_site_joins_the_open_window_and_nothing_is_counted_twice(
    spark, nats_url, checkpoints, uid
):
    # [0, 10) gets a and b; [10, 20) opens (a at 12 s moves the watermark past 10 s)
    first = [
        _reading(uid, "a", 1, 1),
        _reading(uid, "b", 2, 2),
        _reading(uid, "a", 3, 12),
        _reading(uid, "b", 4, 13),
    ]
    _send(nats_url, uid, first)
    old = _global(uid, ("a", "b"))
    # both sources' watermarks pass 10 s: [0, 10) is written, [10, 20) stays open
    _run_until(spark, nats_url, checkpoints, old, lambda: 0.0 in _windows(nats_url, uid))
    assert _windows(nats_url, uid) == {0.0: (2, 3)}
    ck = checkpoints / old.instance / "windows_out"
    assert offset_log_version(spark, str(ck)) == "v2"

    # site c joins: its readings and the others' fall into the open window
    later = [
        _reading(uid, "c", 5, 14),
        _reading(uid, "a", 6, 15),
        _reading(uid, "c", 7, 31),
        _reading(uid, "a", 8, 32),
        _reading(uid, "b", 9, 33),
    ]
    _send(nats_url, uid, later)
    new = _global(uid, ("a", "b", "c"))
    _run_until(spark, nats_url, checkpoints, new, lambda: 10.0 in _windows(nats_url, uid))
    windows = _windows(nats_url, uid)
    assert windows[0.0] == (2, 3)  # written once, by the old version
    assert windows[10.0] == (4, 3 + 4 + 5 + 6)  # the old state (3, 4) and the new (5, 6)
    newest = max((ck / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    assert f"{source_name('from_c')}:" in newest.read_text()


def test_a_checkpoint_kept_by_position_refuses_a_new_source_before_anything_starts(
    spark, nats_url, checkpoints, uid, monkeypatch
):
    readings = [
        _reading(uid, site, i, at)
        for i, (site, at) in enumerate([("a", 1), ("b", 2), ("a", 12), ("b", 13)])
    ]
    _send(nats_url, uid, readings)
    old = _global(uid, ("a", "b"))
    # a checkpoint as spanflow wrote them before it named sources: by position (v1)
    monkeypatch.setattr(source_names, "names_sources", lambda *_: False)
    _run_until(spark, nats_url, checkpoints, old, lambda: 0.0 in _windows(nats_url, uid))
    monkeypatch.undo()
    ck = checkpoints / old.instance / "windows_out"
    assert offset_log_version(spark, str(ck)) == "v1"
    wider = _global(uid, ("a", "b", "c"))
    refused = PipelineRunner(spark, wider, nats_url=nats_url, checkpoint_dir=checkpoints)
    with pytest.raises(UpgradeRefused, match=r"keeps them by position"):
        refused.start()
    assert not [q for q in spark.streams.active if q.name and uid in q.name]
