"""Checkpoints off the node (the site's NATS, ``jetstream://``, or S3, ``s3a://`` on
Ceph's RADOS Gateway): a node that dies is replaced by another with its own empty
disk, which resumes the fragment from the last committed batch — event-time windows
and a keyed processor's state exact, every output once."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from nats.js.api import StreamConfig

from spanflow.nats.streams import connect
from tests.helpers import (
    assert_running_means,
    publish,
    read_all,
    read_records,
    run_pipeline_process,
    wait_for,
    wait_then_stop,
)
from tests.spark.test_exactly_once import _crash

pytestmark = pytest.mark.slow

BASE = 1_800_000_000
N = 2400
DEVICES = ("a", "b", "c")
WINDOW = 1.0
"""The sinks' duplicate window: a node that restarted from scratch would publish its
outputs again after it, and the test would see them twice."""


def _pipeline(uid: str) -> str:
    return f"""
name: js-ckpt-{uid}
trigger: 0s
sources:
  - id: readings
    stream: IN_{uid}
    schema: {{id: long, device: string, v: double, ts: timestamp}}
    key: device
    event_time: ts
    max_out_of_orderness: 2s
    max_rows_per_batch: 200
    to: [mean, per_10s]
processors:
  - id: mean
    type: process
    processor: tests.spark.processors:RunningMean
    output_schema: {{device: string, n: long, mean: double}}
    to: [mean_out]
  - id: per_10s
    type: window
    tumbling: 10s
    aggregates: {{n: count, total: sum(v)}}
    to: [win_out]
sinks:
  - {{id: mean_out, type: jetstream, stream: MEAN_{uid}, subject: "mean{uid}"}}
  - {{id: win_out, type: jetstream, stream: WIN_{uid}, subject: "win{uid}"}}
"""


def _short_window_streams(url: str, streams: dict[str, str]) -> None:
    async def go() -> None:
        nc = await connect(url)
        for name, subject in streams.items():
            await nc.jetstream().add_stream(
                StreamConfig(name=name, subjects=[subject], duplicate_window=WINDOW)
            )
        await nc.close()

    asyncio.run(go())


def _files_under(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()] if directory.exists() else []


@pytest.mark.parametrize("store", ["jetstream", "s3a"])
def test_another_node_resumes_a_stateful_fragment_from_its_checkpoints(
    nats_url, tmp_path, uid, store, request, monkeypatch
):
    records = [
        {"id": i, "device": DEVICES[i % 3], "v": float((i * 37) % 101), "ts": BASE + i * 0.1}
        for i in range(N)
    ]
    flush = {"id": N, "device": "a", "v": 0.0, "ts": BASE + 100_000}  # closes every window
    _short_window_streams(nats_url, {f"MEAN_{uid}": f"mean{uid}", f"WIN_{uid}": f"win{uid}"})
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", [*records, flush])
    by_device: dict[str, list[float]] = defaultdict(list)
    for r in [*records, flush]:
        by_device[r["device"]].append(r["v"])
    windows: Counter[tuple[str, int]] = Counter()
    totals: defaultdict[tuple[str, int], float] = defaultdict(float)
    for r in records:
        key = (r["device"], int(r["ts"] // 10 * 10))
        windows[key] += 1
        totals[key] += r["v"]

    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(uid))
    checkpoints = f"jetstream://ck{uid}/{uid}"
    if store == "s3a":
        s3 = request.getfixturevalue("ceph_s3")
        s3.make_bucket(f"ck-{uid}")
        checkpoints = f"s3a://ck-{uid}/{uid}"
        # where S3A finds its endpoint and credentials: the AWS variables, as in production
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    node_a, node_b, log = tmp_path / "node-a", tmp_path / "node-b", tmp_path / "run.log"

    def means() -> int:
        return len(read_all(nats_url, f"MEAN_{uid}"))

    proc = run_pipeline_process(pipeline, nats_url, node_a, log, checkpoints)
    try:
        wait_for(lambda: means() >= 15, timeout=300)  # a few committed batches
    except AssertionError:
        _crash(proc)
        raise AssertionError(log.read_text()[-3000:]) from None
    _crash(proc)
    published_before = means()
    # Node A kept nothing of its checkpoint on its own disk: node B could not read it anyway.
    assert not [p for p in _files_under(node_a) if "checkpoints" in p.parts]

    proc = run_pipeline_process(pipeline, nats_url, node_b, log, checkpoints)
    wait_then_stop(
        proc,
        log,
        lambda: (
            len(read_all(nats_url, f"WIN_{uid}")) >= len(windows)
            and {r["device"]: r["n"] for r in read_records(nats_url, f"MEAN_{uid}")}
            == {d: len(vs) for d, vs in by_device.items()}
        ),
    )
    assert log.read_text().count("starting Spark") == 2
    assert published_before < means()
    # Keyed state exact; a restart from scratch would count from 1 again.
    assert_running_means(nats_url, f"MEAN_{uid}", by_device)

    # Windows: each once, with its exact count and total.
    seen: Counter[tuple[str, int]] = Counter()
    for r in read_records(nats_url, f"WIN_{uid}"):
        key = (r["device"], int(_epoch(r["window_start"])))
        seen[key] += 1
        assert r["n"] == windows[key] and r["total"] == pytest.approx(totals[key]), key
    assert set(seen) == set(windows) and max(seen.values()) == 1


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_stateful_query_rides_out_a_restart_of_its_checkpoint_store(
    spark, nats_url, tmp_path, uid
):
    """The checkpoint store's server (here a server of its own, so that only the store
    goes away) restarts while batches commit: checkpoint writes wait for it, the query
    neither fails nor restarts, and the outputs are exact and once."""
    import threading
    import time

    import spanflow as sf
    from spanflow.local.server import free_port
    from spanflow.nats import EmbeddedNats
    from spanflow.spark.runner import PipelineRunner
    from tests.spark.processors import RunningMean

    store = EmbeddedNats(tmp_path / "store", port=free_port())
    store.start()
    done = threading.Event()
    conf = spark._jsc.hadoopConfiguration()
    conf.set(f"fs.jetstream.st{uid}.servers", store.url)
    records = [
        {"id": i, "device": DEVICES[i % 3], "v": float(i % 17), "ts": BASE + i * 0.1}
        for i in range(900)
    ]
    flush = {"id": 900, "device": "a", "v": 0.0, "ts": BASE + 100_000}
    publish(nats_url, f"SIN_{uid}", f"sin{uid}.r", [*records, flush])
    by_device: dict[str, list[float]] = defaultdict(list)
    for r in [*records, flush]:
        by_device[r["device"]].append(r["v"])
    flow = (
        sf.Pipeline(f"store-restart-{uid}", trigger="200ms")
        .source(
            f"SIN_{uid}",
            schema={"id": "long", "device": "string", "v": "double", "ts": "timestamp"},
            key="device",
            id="src",
            max_rows_per_batch=30,
        )
        .process(RunningMean, id="mean",
                 output_schema={"device": "string", "n": "long", "mean": "double"})
        .sink_jetstream(f"SMEAN_{uid}", subject=f"smean{uid}", id="out")
    )  # fmt: skip
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=f"jetstream://st{uid}/ck"
    )
    runner.start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"SMEAN_{uid}")) >= 5)
        store.stop()  # mid-stream: the next commits find no server

        def restart() -> None:
            time.sleep(3)  # the outage
            store.start()
            done.wait(120)  # the server lives as long as the thread that started it

        threading.Thread(target=restart, daemon=True).start()
        wait_for(
            lambda: (
                {r["device"]: r["n"] for r in read_records(nats_url, f"SMEAN_{uid}")}
                == {d: len(vs) for d, vs in by_device.items()}
            ),
            timeout=180,
        )
        assert [s.restarts for s in runner.status()] == [0]
        assert all(s.active for s in runner.status())
        query = runner.queries["out"]
        assert query is not None  # a batch waited out the outage in its checkpoint writes
        assert max(p["durationMs"]["triggerExecution"] for p in query.recentProgress) > 2000
    finally:
        runner.stop()
        done.set()
        store.stop()
        conf.unset(f"fs.jetstream.st{uid}.servers")
    assert_running_means(nats_url, f"SMEAN_{uid}", by_device)
