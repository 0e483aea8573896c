"""Test helpers: publish records to and read records from real JetStream streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from spanflow.nats.streams import connect, ensure_stream
from spanflow.spec.retention import Retention
from spanflow.testing.streams import stored as stored  # re-exported for the tests


def publish(
    url: str, stream: str, subject: str, payloads: Iterable[bytes | dict[str, Any]]
) -> None:
    async def go() -> None:
        nc = await connect(url)
        js = nc.jetstream()
        await ensure_stream(js, stream, [subject.split(".")[0] + ".>"])
        futures = []
        for p in payloads:
            data = p if isinstance(p, bytes) else orjson.dumps(p)
            futures.append(await js.publish_async(subject, data))
            if len(futures) >= 2000:
                await asyncio.gather(*futures)
                futures = []
        await asyncio.gather(*futures)
        await nc.close()

    asyncio.run(go())


def read_all(url: str, stream: str) -> list[tuple[dict[str, str] | None, bytes, str]]:
    """Every stored message of a stream: (headers, data, subject)."""

    async def go() -> list[tuple[dict[str, str] | None, bytes, str]]:
        nc = await connect(url)
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except Exception:
            await nc.close()
            return []
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                m = await js.get_msg(stream, seq)
            except Exception:
                continue
            out.append((m.headers, m.data or b"", m.subject or ""))
        await nc.close()
        return out

    return asyncio.run(go())


def read_records(url: str, stream: str) -> list[dict[str, Any]]:
    return [json.loads(data) for _, data, _ in read_all(url, stream)]


def wait_for(predicate: Callable[[], bool], timeout: float = 120.0, interval: float = 0.25) -> None:
    """Poll a condition (never a bare sleep standing in for synchronisation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout:.0f} s")


@contextlib.contextmanager
def supervising(*runners: Any, every: float = 0.5) -> Iterator[None]:
    """Restart failed queries from their checkpoints while the block runs, as a node's
    agent does (``PipelineRunner.supervise``): a query that fails once — e.g. Spark
    gives a new Python process 10 s to connect back, which a loaded machine can miss —
    comes back instead of failing the test that waits for its output."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            for runner in runners:
                runner.supervise()

    thread = threading.Thread(target=loop, name="supervise", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run_until(
    spark: Any,
    nats_url: str,
    checkpoints: Any,
    flow: Any,
    out_stream: str,
    expected: int,
    *,
    timeout: float = 120.0,
) -> list[dict[str, Any]]:
    """Run a flow until its sink stream holds ``expected`` records; return them."""
    from spanflow.spark.runner import PipelineRunner

    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions=flow.functions
    ).start()
    try:
        with supervising(runner):
            wait_for(lambda: len(read_all(nats_url, out_stream)) >= expected, timeout=timeout)
            runner.await_idle()
    finally:
        runner.stop()
    return read_records(nats_url, out_stream)


def kv_apply(url: str, bucket: str, changes: dict[str, Any], *, history: int = 1) -> None:
    """Put (a value, as JSON) or delete (None) entries of a key-value bucket, creating
    the bucket with ``history`` changes kept per key if it is missing."""

    async def go() -> None:
        nc = await connect(url)
        try:
            js = nc.jetstream()
            try:
                kv = await js.key_value(bucket)
            except Exception:
                kv = await js.create_key_value(bucket=bucket, history=history)
            for key, value in changes.items():
                if value is None:
                    await kv.delete(key)
                else:
                    await kv.put(key, orjson.dumps(value))
        finally:
            await nc.close()

    asyncio.run(go())


BASE = datetime(2026, 1, 1, tzinfo=UTC)
"""Event time of :class:`Feed`'s first reading."""


class Feed:
    """Readings with event times 10 ms apart (so windows are known in advance), sent
    at about ``rate`` per second to ``<prefix>.<device>``; a publish that fails (a
    server died) is retried until acknowledged, so every reading is stored exactly once
    (same message id)."""

    def __init__(
        self, url: str, stream: str, prefix: str, *, replicas: int = 1, rate: float = 100.0
    ) -> None:
        self.url, self.stream, self.prefix = url, stream, prefix
        self.replicas, self.pause = replicas, 1.0 / rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    @staticmethod
    def reading(i: int) -> dict[str, Any]:
        ts = BASE + timedelta(milliseconds=10 * i)
        return {"device": f"d{i % 4}", "ts": ts.isoformat(), "id": i}

    async def _run(self) -> None:
        nc = await connect(self.url)
        js = nc.jetstream()
        retention = Retention(replicas=self.replicas)
        for attempt in range(150):  # a cluster just started may still elect its meta leader
            try:
                await ensure_stream(js, self.stream, [f"{self.prefix}.>"], retention=retention)
                break
            except Exception:
                if attempt == 149:
                    raise
                await asyncio.sleep(0.2)
        while not self._stop.is_set():
            record = self.reading(self.sent)
            while True:
                try:
                    await js.publish(
                        f"{self.prefix}.{record['device']}",
                        orjson.dumps(record),
                        headers={"Nats-Msg-Id": f"r{self.sent}"},
                        timeout=2,
                    )
                    break
                except Exception:
                    await asyncio.sleep(0.2)
            self.sent += 1
            await asyncio.sleep(self.pause)
        # One reading far ahead: the watermark passes every window of the run.
        # Retried like every reading: a lost flush leaves the last windows open forever.
        last = {"device": "flush", "ts": (BASE + timedelta(days=1)).isoformat(), "id": -1}
        for _ in range(100):
            try:
                await js.publish(
                    f"{self.prefix}.flush",
                    orjson.dumps(last),
                    headers={"Nats-Msg-Id": "flush"},
                    timeout=2,
                )
                break
            except Exception:
                await asyncio.sleep(0.2)
        await nc.close()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        return self.sent


def assert_feed_exactly_once(url: str, events: str, windows: str, sent: int) -> None:
    """A :class:`Feed`'s ``sent`` readings, each once in stream ``events``, and the
    per-device 2-s tumbling window counts of them, each window once and exact, in
    stream ``windows`` (the chaos tests' pipeline)."""
    wait_for(lambda: stored(url, events) >= sent, timeout=180)
    ids = Counter(json.loads(data)["id"] for _, data, _ in read_all(url, events))
    assert ids == Counter(range(sent)), (
        f"lost {len(set(range(sent)) - set(ids))}, "
        f"duplicated {sum(n - 1 for n in ids.values() if n > 1)}"
    )
    expected: Counter[tuple[str, str]] = Counter()
    for i in range(sent):
        r = Feed.reading(i)
        start = BASE + timedelta(seconds=(10 * i // 1000) // 2 * 2)
        expected[(r["device"], start.isoformat())] += 1

    def written() -> dict[tuple[str, str], list[int]]:
        out: dict[tuple[str, str], list[int]] = {}
        for _, data, _ in read_all(url, windows):
            w = json.loads(data)
            start = datetime.fromisoformat(w["window_start"].replace("Z", "+00:00"))
            out.setdefault((w["device"], start.isoformat()), []).append(w["n"])
        return out

    wait_for(lambda: len(written()) >= len(expected), timeout=120)
    got = written()
    assert {k: v for k, v in got.items() if len(v) > 1} == {}  # each window once
    wrong = {k: (v[0], expected.get(k)) for k, v in got.items() if v[0] != expected.get(k)}
    missing = sorted(set(expected) - set(got))
    assert not wrong and not missing, f"windows (got, expected): {wrong}; missing {missing[:5]}"


def run_pipeline_process(
    pipeline: Path,
    nats_url: str,
    data_dir: Path,
    log: Path,
    checkpoints: str | None = None,
    master: str | None = None,
    spark_conf: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``spanflow run PIPELINE`` in its own process group (so a test can SIGKILL the whole
    tree at once, as a power cut would), output appended to ``log``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spanflow.cli",
            "run",
            str(pipeline),
            "--nats",
            nats_url,
            "--data-dir",
            str(data_dir),
            *(["--checkpoints", checkpoints] if checkpoints else []),
            *(["--master", master] if master else []),
            *(arg for k, v in (spark_conf or {}).items() for arg in ("--spark-conf", f"{k}={v}")),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )


def sigkill_twice_then_finish(
    pipeline: Path,
    nats_url: str,
    tmp_path: Path,
    written: Callable[[], int],
    expected: int,
    timeout: float = 180.0,
) -> Path:
    """``spanflow run PIPELINE``, SIGKILLed (the whole process tree, as a power cut
    would) once ``written()`` reaches 15 % and again at 50 % of ``expected``, then run
    until it reaches ``expected`` and stopped. Returns the run's log."""
    data_dir, log = tmp_path / "node", tmp_path / "run.log"
    for fraction in (0.15, 0.5):
        proc = run_pipeline_process(pipeline, nats_url, data_dir, log)
        try:
            wait_for(lambda f=fraction: written() >= expected * f, timeout=timeout)  # type: ignore[misc]
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    proc = run_pipeline_process(pipeline, nats_url, data_dir, log)
    try:
        wait_for(lambda: written() >= expected, timeout=timeout)
    finally:
        proc.terminate()
        proc.wait(60)
    return log


def wait_then_stop(
    proc: subprocess.Popen[bytes], log: Path, done: Callable[[], bool], timeout: float = 300
) -> None:
    """Wait until ``done`` (failing with the run's log tail), then stop the pipeline
    process cleanly (SIGINT)."""
    try:
        wait_for(done, timeout=timeout)
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def assert_running_means(url: str, stream: str, values: dict[str, list[float]]) -> None:
    """A keyed running mean's outputs: per key, ``n`` only grows and never repeats (state
    lost or an output published twice would), and the last mean is exact."""
    import pytest

    per_key: dict[str, list[tuple[int, float]]] = {}
    for r in read_records(url, stream):
        per_key.setdefault(r["device"], []).append((r["n"], r["mean"]))
    assert set(per_key) == set(values)
    for key, rows in per_key.items():
        ns = [n for n, _ in rows]
        assert ns == sorted(set(ns)), f"{key}: state lost or output repeated: {ns}"
        assert rows[-1][1] == pytest.approx(sum(values[key]) / len(values[key]))


def stream_leader(url: str, stream: str) -> int | None:
    """Index of the server (named ``<name>-<n>``, as :class:`NatsCluster` names them)
    leading ``stream``'s Raft group (None: electing, or not answering)."""
    info = _stream_info(url, stream)
    if info is None:
        return None
    leader = info.cluster.leader if info.cluster is not None else None
    return int(leader.rsplit("-", 1)[1]) - 1 if leader else None


def all_copies_current(url: str, stream: str, copies: int = 3) -> bool:
    """Whether ``stream`` has a leader and all its other ``copies`` - 1 replicas are
    current (a restarted server caught up): killing a server before that would take a
    quorum away, a two-server fault rather than one."""
    info = _stream_info(url, stream)
    cluster = info.cluster if info is not None else None
    if cluster is None or not cluster.leader:
        return False
    followers = cluster.replicas or []
    return len(followers) == copies - 1 and all(r.current and not r.offline for r in followers)


def _stream_info(url: str, stream: str) -> Any:
    """``stream``'s info, None when it does not answer within 5 s."""
    from spanflow.nats.streams import SyncNats

    client = SyncNats(url)
    try:
        return client.run(lambda: client.js.stream_info(stream), timeout=5)
    except Exception:
        return None
    finally:
        client.close()
