"""Keyed state survives crashes: a pipeline of keyed processors, event-time timers, count
windows, an incremental reduce, a left interval join and an enrichment from a live
key-value table is SIGKILLed twice mid-stream and restarted from its checkpoint; every
output is exact and published once."""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime

import pytest

from tests.helpers import kv_apply, publish, read_all, read_records, wait_for
from tests.spark.test_exactly_once import _crash, _start

pytestmark = pytest.mark.slow

BASE = 1_800_000_000
N = 1800
DEVICES = ("a", "b", "c")


def _pipeline(uid: str) -> str:
    return f"""
name: keyed-{uid}
trigger: 0s
sources:
  - id: readings
    stream: IN_{uid}
    schema: {{id: long, device: string, v: double, ts: timestamp}}
    key: device
    event_time: ts
    max_out_of_orderness: 2s
    max_rows_per_batch: 300
    to: [mean, silence, per_7, biggest, near, configured]
  - id: events
    stream: EV_{uid}
    schema: {{device: string, ts: timestamp, kind: string}}
    event_time: ts
    max_out_of_orderness: 2s
    max_rows_per_batch: 20
    to: [near]
processors:
  - id: mean
    type: process
    processor: tests.spark.processors:RunningMean
    output_schema: {{device: string, n: long, mean: double}}
    to: [mean_out]
  - id: silence
    type: process
    processor: tests.spark.processors:Silence
    params: {{gap: 10}}
    output_schema: {{device: string, silent_since: timestamp, fired_at: timestamp}}
    to: [silence_out]
  - id: per_7
    type: count_window
    size: 7
    slide: 3
    aggregates: {{n: count, total: sum(v)}}
    to: [cw_out]
  - id: biggest
    type: window
    tumbling: 10s
    reduce: tests.spark.processors:keep_max
    to: [max_out]
  - id: near
    type: join
    on: device
    within: [-1s, +1s]
    how: left
    to: [join_out]
  - id: configured
    type: enrich
    table: kv:CFG_{uid}
    on: device
    schema: {{level: long}}
    to: [enrich_out]
sinks:
  - {{id: mean_out, type: jetstream, stream: MEAN_{uid}, subject: "mean{uid}"}}
  - {{id: silence_out, type: jetstream, stream: SIL_{uid}, subject: "sil{uid}"}}
  - {{id: cw_out, type: jetstream, stream: CW_{uid}, subject: "cw{uid}"}}
  - {{id: max_out, type: jetstream, stream: MAX_{uid}, subject: "max{uid}"}}
  - {{id: join_out, type: jetstream, stream: JOIN_{uid}, subject: "join{uid}"}}
  - {{id: enrich_out, type: jetstream, stream: ENR_{uid}, subject: "enr{uid}"}}
"""


def _records() -> list[dict]:
    out = []
    for i in range(N):
        device = DEVICES[i % 3]
        if device == "c" and i >= N // 2:
            continue  # c falls silent half way
        out.append({"id": i, "device": device, "v": float((i * 37) % 101), "ts": BASE + i * 0.1})
    return out


def _count_windows(values: list[float], size: int, slide: int) -> list[tuple[int, float]]:
    return [
        (len(values[max(0, n - size) : n]), sum(values[max(0, n - size) : n]))
        for n in range(slide, len(values) + 1, slide)
    ]


def _secs(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_keyed_state_timers_and_count_windows_exact_across_sigkill_restarts(
    nats_url, tmp_path, uid
):
    records = _records()
    flush = {"id": N, "device": "a", "v": 0.0, "ts": BASE + 100_000}  # closes every window
    # The table changes between chunks of readings: each reading is enriched with the
    # entry as it was when the reading was stored, however the run is cut.
    levels: dict[int, int | None] = {}
    third = N // 3
    chunks = [
        (0, third, {"a": 1, "b": 1}),
        (third, 2 * third, {"a": 2}),
        (2 * third, N + 1, {"b": None}),
    ]
    table: dict[str, int | None] = {}
    for lo, hi, changes in chunks:
        # History keeps every change, so each reading's entry can be checked exactly.
        kv_apply(
            nats_url,
            f"CFG_{uid}",
            {k: None if v is None else {"level": v} for k, v in changes.items()},
            history=10,
        )
        table.update(changes)
        chunk = [r for r in [*records, flush] if lo <= r["id"] < hi]
        publish(nats_url, f"IN_{uid}", f"in{uid}.r", chunk)
        levels.update({r["id"]: table.get(r["device"]) for r in chunk})
    events = [
        {"device": d, "ts": BASE + 10 * k + 0.5, "kind": "check"}
        for k in range(N // 100)  # one check every 10 s of the readings
        for d in DEVICES
    ] + [{"device": "a", "ts": BASE + 100_000, "kind": "flush"}]
    publish(nats_url, f"EV_{uid}", f"ev{uid}.r", events)
    near = Counter(
        (r["id"], e["ts"])
        for e in events
        for r in [*records, flush]
        if r["device"] == e["device"] and abs(r["ts"] - e["ts"]) <= 1
    )
    alone = {r["id"] for r in [*records, flush]} - {i for i, _ in near}  # left join: nulls
    by_device: dict[str, list[dict]] = defaultdict(list)
    for r in [*records, flush]:
        by_device[r["device"]].append(r)

    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(uid))
    data_dir, log = tmp_path / "node", tmp_path / "run.log"
    expected_windows = {
        d: _count_windows([r["v"] for r in rs], 7, 3) for d, rs in by_device.items()
    }
    n_windows = sum(map(len, expected_windows.values()))
    maxima: dict[tuple[str, int], float] = {}
    for r in records:
        key = (r["device"], int(r["ts"] // 10 * 10))
        maxima[key] = max(maxima.get(key, r["v"]), r["v"])

    def windows_out() -> int:
        return len(read_all(nats_url, f"CW_{uid}"))

    for fraction in (0.4,):  # one SIGKILL mid-stream (two cost 90 s more of CI)
        proc = _start(pipeline, nats_url, data_dir, log)
        try:
            wait_for(lambda f=fraction: windows_out() >= int(n_windows * f), timeout=300)
        except AssertionError:
            proc.kill()
            raise AssertionError(log.read_text()[-3000:]) from None
        _crash(proc)

    proc = _start(pipeline, nats_url, data_dir, log)
    try:
        wait_for(
            lambda: (
                windows_out() >= n_windows
                and len(read_all(nats_url, f"SIL_{uid}")) >= 2
                and len(read_all(nats_url, f"MAX_{uid}")) >= len(maxima)
                and len(read_all(nats_url, f"JOIN_{uid}")) >= len(near) + len(alone)
                and len(read_all(nats_url, f"ENR_{uid}")) >= len(levels)
            ),
            timeout=300,
        )
        wait_for(
            lambda: (
                {r["device"]: r["n"] for r in read_records(nats_url, f"MEAN_{uid}")}
                == {d: len(rs) for d, rs in by_device.items()}
            ),
            timeout=120,
        )
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert log.read_text().count("starting Spark") == 2

    # Running state: per device, n only grows and no (device, n) is published twice.
    means = defaultdict(list)
    for r in read_records(nats_url, f"MEAN_{uid}"):
        means[r["device"]].append((r["n"], r["mean"]))
    for device, rows in means.items():
        ns = [n for n, _ in rows]
        assert ns == sorted(set(ns)), f"{device}: state lost or output repeated: {ns}"
        values = [r["v"] for r in by_device[device]]
        assert rows[-1][1] == pytest.approx(sum(values) / len(values))

    # Count windows: exactly the oracle's, each once.
    got = defaultdict(list)
    for r in sorted(read_records(nats_url, f"CW_{uid}"), key=lambda r: r["window_index"]):
        got[r["device"]].append((r["n"], r["total"]))
    assert dict(got) == expected_windows

    # Event-time timers: b and c fell silent (a's flush deadline is not yet passed).
    silent = Counter()
    for r in read_records(nats_url, f"SIL_{uid}"):
        silent[r["device"]] += 1
        last = by_device[r["device"]][-1]["ts"]
        assert _secs(r["silent_since"]) == pytest.approx(last)
        assert _secs(r["fired_at"]) == pytest.approx(last + 10)
    assert silent == Counter({"b": 1, "c": 1})

    # Incremental reduce: each window once, with its maximum.
    seen = Counter()
    for r in read_records(nats_url, f"MAX_{uid}"):
        key = (r["device"], int(_secs(r["window_start"])))
        seen[key] += 1
        assert r["v"] == maxima[key], key
    assert set(seen) == set(maxima) and max(seen.values()) == 1

    # Left interval join: every pair once, and every reading without a match once.
    pairs = Counter(
        (r["id"], None if r["ts_right"] is None else round(_secs(r["ts_right"]), 3))
        for r in read_records(nats_url, f"JOIN_{uid}")
    )
    wanted = Counter({(i, round(t, 3)): 1 for i, t in near})
    wanted.update({(i, None): 1 for i in alone})
    assert pairs == wanted, (
        f"missing {sorted(wanted - pairs, key=str)[:20]}, "
        f"extra {sorted(pairs - wanted, key=str)[:20]}, "
        f"published {len(read_all(nats_url, f'JOIN_{uid}'))}"
    )

    # Enrichment from a live table: the entry as of each reading, each reading once.
    enriched = Counter()
    for r in read_records(nats_url, f"ENR_{uid}"):
        enriched[r["id"]] += 1
        assert r["level"] == levels[r["id"]], r
    assert set(enriched) == set(levels) and max(enriched.values()) == 1


def _processing_time_pipeline(uid: str) -> str:
    return f"""
name: alarm-{uid}
trigger: 500ms
sources:
  - {{id: readings, stream: AL_{uid}, schema: {{id: long, device: string}}, key: device,
     to: [alarm, per_3]}}
processors:
  - id: alarm
    type: process
    processor: tests.spark.processors:Alarm
    timers: processing_time
    params: {{delay: 4, ttl: 10m}}
    output_schema: {{device: string, kind: string, id: "long?", at: timestamp}}
    to: [alarm_out]
  - {{id: per_3, type: count_window, size: 3, aggregates: {{n: count, ids: sum(id)}},
     to: [cw_out]}}
sinks:
  - {{id: alarm_out, type: jetstream, stream: ALARM_{uid}, subject: "alarm{uid}"}}
  - {{id: cw_out, type: jetstream, stream: TUMBLE_{uid}, subject: "tumble{uid}"}}
"""


def test_processing_time_timers_ttl_state_and_tumbling_count_windows_survive_sigkill(
    nats_url, tmp_path, uid
):
    """A processing-time timer armed before a crash rings after the restart, once; state
    with a TTL still drops repeats; a tumbling count window goes on counting."""
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_processing_time_pipeline(uid))
    data_dir, log = tmp_path / "node", tmp_path / "run.log"
    subject = f"al{uid}.r"

    def rows(kind: str) -> list[dict]:
        return [r for r in read_records(nats_url, f"ALARM_{uid}") if r["kind"] == kind]

    def running(condition: Callable[[], bool]) -> Callable[[], bool]:
        """The condition, failing at once if the pipeline process has died."""

        def check() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the pipeline exited with {proc.returncode}")
            return condition()

        return check

    publish(nats_url, f"AL_{uid}", subject, [{"id": i, "device": "a"} for i in range(4)])
    proc = _start(pipeline, nats_url, data_dir, log)
    try:
        wait_for(running(lambda: len(rows("armed")) == 1), timeout=240)
    except AssertionError as error:
        proc.kill()
        raise AssertionError(f"{error}\n{log.read_text()[-3000:]}") from None
    _crash(proc)  # the timer is due 4 s after arming: the process is gone by then
    armed_at = _secs(rows("armed")[0]["at"])
    publish(nats_url, f"AL_{uid}", subject, [{"id": i, "device": "a"} for i in (2, 3, 4, 5, 6)])
    proc = _start(pipeline, nats_url, data_dir, log)
    try:
        wait_for(
            running(
                lambda: len(rows("ring")) == 1 and len(read_all(nats_url, f"TUMBLE_{uid}")) >= 3
            ),
            timeout=240,
        )
        wait_for(running(lambda: len(rows("record")) >= 7), timeout=60)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{log.read_text()[-3000:]}") from None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    (ring,) = rows("ring")
    assert _secs(ring["at"]) == pytest.approx(armed_at + 4, abs=0.01)
    assert len(rows("armed")) == 1  # not armed again: the state survived
    assert sorted(r["id"] for r in rows("record")) == list(range(7))  # repeats dropped
    windows = sorted(
        (r["window_index"], r["n"], r["ids"]) for r in read_records(nats_url, f"TUMBLE_{uid}")
    )
    # ids 0..3 then 2, 3, 4, 5, 6 again: records 0-2, 3-2-3, 4-5-6
    assert windows == [(0, 3, 0 + 1 + 2), (1, 3, 3 + 2 + 3), (2, 3, 4 + 5 + 6)]
