"""The webhook sink against a real HTTP server: every record POSTed with an
idempotency key, retried through 503s, refused ones dead-lettered with the reason;
across SIGKILLs the keys make deliveries exactly once for a receiver that dedupes."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

import spanflow as sf
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, wait_for

SCHEMA = {"id": "long", "device": "string"}


class Receiver:
    """An HTTP server that answers 503 to each record's first try, 400 to records
    whose device is 'bad', and 200 otherwise; it keeps what it accepted."""

    def __init__(self, always_accept: bool = False) -> None:
        self.accepted: list[tuple[str, dict]] = []
        self.tries: Counter[str] = Counter()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers["Idempotency-Key"]
                with receiver.lock:
                    receiver.tries[key] += 1
                    first = receiver.tries[key] == 1
                status = 400 if body["device"] == "bad" else 503 if first else 200
                if always_accept:
                    status = 200
                if status == 200:
                    with receiver.lock:
                        receiver.accepted.append((key, body))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no" if status == 400 else b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_each_record_posted_with_retries_and_refused_ones_dead_lettered(
    spark, nats_url, checkpoints, uid
):
    receiver = Receiver()
    records = [{"id": i, "device": "bad" if i % 10 == 7 else "ok"} for i in range(30)]
    flow = (
        sf.Pipeline(f"wh-{uid}", trigger="0.5s")
        .source(f"WH_{uid}", subjects=[f"wh{uid}.>"], schema=SCHEMA)
        .sink_webhook(receiver.url, headers={"X-Site": "plant-1"}, backoff=0.05, retries=3)
    )
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        publish(nats_url, f"WH_{uid}", f"wh{uid}.r", records)
        wait_for(lambda: len(receiver.accepted) >= 27)
        wait_for(lambda: len(_letters(nats_url, uid)) >= 3)
        runner.await_idle()
    finally:
        runner.stop()
        receiver.server.shutdown()
    good = [r["id"] for r in records if r["device"] == "ok"]
    assert sorted(body["id"] for _, body in receiver.accepted) == good
    assert len({key for key, _ in receiver.accepted}) == len(good)
    letters = _letters(nats_url, uid)
    assert sorted(orjson.loads(d)["id"] for _, d in letters) == [7, 17, 27]
    assert all("HTTP 400" in h["Spanflow-Reason"] for h, _ in letters)
    # a refused record is not retried; each accepted one took exactly two tries
    assert all(receiver.tries[k] == 2 for k, _ in receiver.accepted)


def _letters(nats_url: str, uid: str) -> list:
    return [(h, d) for h, d, s in read_all(nats_url, "SPANFLOW_DLQ") if f"wh-{uid}" in s]


@pytest.mark.slow
def test_idempotency_keys_make_deliveries_exactly_once_across_sigkill_restarts(
    nats_url, tmp_path, uid
):
    from tests.helpers import sigkill_twice_then_finish
    from tests.spark import sink_cases

    receiver = Receiver(always_accept=True)
    n = 1500
    records, pipeline = sink_cases.crash_pipeline(
        nats_url, tmp_path, uid, "wheo", n, f'type: webhook, url: "{receiver.url}"'
    )
    try:
        sigkill_twice_then_finish(
            pipeline, nats_url, tmp_path, lambda: len({k for k, _ in receiver.accepted}), n
        )
    finally:
        receiver.server.shutdown()
    # at least once per record; one key per record, the same on every resend
    by_key: dict[str, set[int]] = {}
    for key, body in receiver.accepted:
        by_key.setdefault(key, set()).add(body["id"])
    assert all(len(ids) == 1 for ids in by_key.values())
    assert sorted(i for ids in by_key.values() for i in ids) == [r["id"] for r in records]
