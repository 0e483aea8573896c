"""detect_anomalies and learn on real Spark: per key and global outputs equal a plain
run of the same detector or River model over the same records, split over many
micro-batches; only anomalies when asked; the same after a SIGKILL and a restart
from the checkpoint (so no record was learnt twice) — and, in the same pipeline, an
event pattern's matches with partial matches open at the crash."""

from __future__ import annotations

import random
import signal
from collections import Counter, defaultdict
from datetime import UTC, datetime

import orjson
import pytest
from river import anomaly, linear_model, metrics, preprocessing

import spanflow as sf
from spanflow.cep.nfa import NFA
from spanflow.ml.anomaly import judge
from spanflow.ml.calibration import TailCalibration
from spanflow.ml.detector import Detector
from spanflow.ml.detectors import make_detector
from spanflow.ml.episodes import Episodes
from spanflow.ml.scaling import UnitScaler
from spanflow.ml.thresholds import make_threshold
from spanflow.spark.runner import PipelineRunner
from spanflow.spec.steps.models import DetectAnomaliesStep
from tests.helpers import publish, read_all, read_records, wait_for
from tests.ml.test_likelihood import nab_series
from tests.spark.test_exactly_once import _crash, _start
from tests.spark.test_patterns import _seconds

BASE = 1_800_000_000
SCHEMA = {
    "id": "long",
    "device": "string",
    "ts": "timestamp",
    "t": "double",
    "v": "double",
    "hot": "boolean?",
}
FIELDS = ("t", "v")


def _records(n: int) -> list[dict]:
    rng = random.Random(5)
    out = []
    for i in range(n):
        spike = 6.0 if i % 89 == 60 else 0.0
        out.append(
            {
                "id": i,
                "device": "ab"[i % 2],
                "ts": BASE + i * 60,
                "t": round(20 + rng.gauss(0, 0.5) + spike, 4),
                "v": round(0.5 + rng.gauss(0, 0.05), 4),
                "hot": None if i % 7 == 3 else bool(i % 89 == 60 or rng.random() < 0.3),
            }
        )
    return out


def _expected_scores(
    records: list[dict], warmup: int, method: str = "likelihood"
) -> dict[int, tuple]:
    """(score, anomalous, field) by id: the detector run on each device's records."""
    by_device = defaultdict(list)
    for r in records:
        by_device[r["device"]].append(r)
    out = {}
    for rows in by_device.values():
        detector = _detector(method, warmup)
        t = make_threshold(0.5)
        times = [datetime.fromtimestamp(r["ts"], UTC) for r in rows]
        verdicts = judge(detector, detector.load(None), t, t.empty(), rows, times, warmup)
        out.update({r["id"]: v for r, v in zip(rows, verdicts, strict=True)})
    return out


def _detector(method: str, warmup: int) -> Detector:
    """The detector a step of ``method`` with ``warmup`` compiles to, without Spark."""
    step = DetectAnomaliesStep(id="d", fields=FIELDS, method=method, warmup=warmup)
    season = step.season_seconds(has_event_time=True)
    return make_detector(method, FIELDS, step.detector_params(), season)


def _with_a_fault(records: list[dict]) -> list[dict]:
    """Device a's t runs 3 degrees warm for 150 of its readings (a fault that lasts),
    then comes back."""
    out = [dict(r) for r in records]
    for r in out:
        if r["device"] == "a" and 400 <= r["id"] < 700:
            r["t"] = round(r["t"] + 3.0, 4)
    return out


def _expected_hst(records: list[dict]) -> dict[int, float]:
    """River's HalfSpaceTrees over each field and its change, scores calibrated."""
    model = UnitScaler() | anomaly.HalfSpaceTrees(seed=42)
    calibration = TailCalibration()
    tail, last, out = calibration.empty(), {}, {}
    for r in records:
        x = {f: float(r[f]) for f in FIELDS if r.get(f) is not None}
        x |= {f"{f}~d": v - last.get(f, v) for f, v in list(x.items())}
        last |= {f: v for f, v in x.items() if "~" not in f}
        out[r["id"]] = calibration.step(tail, model.score_one(x))
        model.learn_one(x)
    return out


def _run(spark, nats_url, checkpoints, flow, outputs: list[str], expected: int) -> None:
    """Run ``flow`` until each output stream holds ``expected`` records and it is idle."""
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions=flow.functions
    ).start()
    try:
        wait_for(
            lambda: all(len(read_all(nats_url, out)) >= expected for out in outputs), timeout=240
        )
        runner.await_idle()
    finally:
        runner.stop()


def test_scores_per_key_and_global_equal_a_plain_run(spark, nats_url, checkpoints, uid):
    records = _records(600)
    stream = f"IN_{uid}"
    publish(nats_url, stream, f"in{uid}.r", records)
    p = sf.Pipeline(f"anomaly-{uid}", trigger=0)
    readings = p.source(stream, schema=SCHEMA, event_time="ts", max_rows_per_batch=70)
    keyed = readings.key_by("device")
    every = keyed.detect_anomalies(
        ["t", "v"], method="robust", threshold=0.5, warmup=30
    ).sink_jetstream(f"ALL_{uid}", subject=f"all{uid}")
    only = keyed.detect_anomalies(
        ["t", "v"], method="robust", threshold=0.5, warmup=30, emit="anomalies"
    ).sink_jetstream(f"ONLY_{uid}", subject=f"only{uid}")
    whole = readings.detect_anomalies(["t", "v"], method="hst").sink_jetstream(
        f"HST_{uid}", subject=f"hst{uid}"
    )
    joint = keyed.detect_anomalies(["t", "v"], method="multivariate", warmup=30).sink_jetstream(
        f"MV_{uid}", subject=f"mv{uid}"
    )
    outputs = [f"ALL_{uid}", f"HST_{uid}", f"MV_{uid}"]
    flow = every.merge(only, whole, joint)
    _run(spark, nats_url, checkpoints, flow, outputs, len(records))
    expected = _expected_scores(records, 30, "robust")
    got = {r["id"]: r for r in read_records(nats_url, f"ALL_{uid}")}
    assert len(got) == len(read_all(nats_url, f"ALL_{uid}")) == len(records)
    for i, (score, flag, field) in expected.items():
        row = got[i]
        assert (row["anomaly_score"], row["is_anomaly"], row["anomaly_field"]) == (
            score,
            flag,
            field,
        ), row
        assert row["t"] == records[i]["t"] and row["device"] == records[i]["device"]
    flagged = sorted(i for i, (_, flag, _) in expected.items() if flag)
    assert flagged and all(records[i]["t"] > 24 for i in flagged)
    assert sorted(r["id"] for r in read_records(nats_url, f"ONLY_{uid}")) == flagged
    hst = _expected_hst(records)
    assert {r["id"]: r["anomaly_score"] for r in read_records(nats_url, f"HST_{uid}")} == hst
    joint = _expected_scores(records, 30, "multivariate")
    got = {
        r["id"]: (r["anomaly_score"], r["is_anomaly"], r["anomaly_field"])
        for r in read_records(nats_url, f"MV_{uid}")
    }
    assert got == joint


def _nab_records() -> list[dict]:
    """Two NAB series as two keys, with what real feeds do: a null reading, a gap of
    three days in the middle of one series, a reading from the past."""
    out = []
    for key, name in (("cpc", "exchange-2_cpc_results.csv"), ("art", "art_daily_jumpsup.csv")):
        times, values = nab_series(name)
        for i, (t, v) in enumerate(zip(times, values, strict=True)):
            gap = 3 * 86400 if key == "art" and i >= 2000 else 0
            out.append({"id": len(out), "series": key, "ts": int(t.timestamp()) + gap, "value": v})
    out[900]["value"] = None
    # A reading from the past (a clock gone backwards), published last: it is alone
    # in its batch for its key, so it is scored after every other reading of the key
    out.append({"id": len(out), "series": "cpc", "ts": out[100]["ts"], "value": 0.05})
    return out


def test_the_default_detector_on_nab_series_equals_the_pure_run(spark, nats_url, checkpoints, uid):
    records = _nab_records()
    stream = f"NAB_{uid}"
    not_a_number = orjson.dumps({"id": -1, "series": "cpc", "ts": BASE, "value": "12,5"})
    publish(nats_url, stream, f"nab{uid}.r", [*records[:50], not_a_number, *records[50:]])
    flow = (
        sf.Pipeline(f"nab-{uid}", trigger=0)
        .source(
            stream,
            schema={"id": "long", "series": "string", "ts": "timestamp", "value": "double?"},
            key="series",
            event_time="ts",
            max_rows_per_batch=1200,
            id="src",
        )
        .detect_anomalies("value")
        .sink_jetstream(f"NABOUT_{uid}", subject=f"nabout{uid}")
    )
    _run(spark, nats_url, checkpoints, flow, [f"NABOUT_{uid}"], len(records))
    got = {r["id"]: r for r in read_records(nats_url, f"NABOUT_{uid}")}
    assert sorted(got) == [r["id"] for r in records]
    for key in ("cpc", "art"):
        rows = [r for r in records if r["series"] == key]
        detector = make_detector("likelihood", ("value",), {}, None)
        t = make_threshold(0.5)
        times = [datetime.fromtimestamp(r["ts"], UTC) for r in rows]
        verdicts = judge(detector, detector.load(None), t, t.empty(), rows, times, 300)
        for r, (score, flag, field) in zip(rows, verdicts, strict=True):
            out = got[r["id"]]
            assert (out["anomaly_score"], out["is_anomaly"], out["anomaly_field"]) == (
                score,
                flag,
                field,
            ), out
    assert got[900]["anomaly_field"] is None  # the null reading was not scored
    assert any(r["is_anomaly"] for r in got.values())
    letters = [
        h
        for h, _, subject in read_all(nats_url, "SPANFLOW_DLQ")
        if subject.endswith(f"nab-{uid}.src")
    ]
    assert len(letters) == 1 and "field 'value'" in letters[0]["Spanflow-Reason"]


def _expected_alarms(
    records: list[dict], warmup: int, quiet: int, method: str = "likelihood"
) -> Counter:
    """(device, episode, start, end, anomalies, readings, peak) of each episode row: the
    detector and the episode tracker over each device's records."""
    out: Counter = Counter()
    for device, verdicts in _verdicts_by_device(records, warmup, method).items():
        tracker, state = Episodes(quiet_readings=quiet), Episodes().empty()
        for (_, at), (score, flag, field) in verdicts:
            for row in tracker.step(state, at, score, flag, field):
                out[_alarm_key(device, row)] += 1
    return out


def _verdicts_by_device(records: list[dict], warmup: int, method: str) -> dict[str, list]:
    out = {}
    for device in sorted({r["device"] for r in records}):
        rows = [r for r in records if r["device"] == device]
        detector = _detector(method, warmup)
        t = make_threshold(0.5)
        times = [datetime.fromtimestamp(r["ts"], UTC) for r in rows]
        verdicts = judge(detector, detector.load(None), t, t.empty(), rows, times, warmup)
        out[device] = list(zip(zip(rows, times, strict=True), verdicts, strict=True))
    return out


def _alarm_key(device: str, row: dict) -> tuple:
    def seconds(value: object) -> int | None:
        if value is None:
            return None
        if isinstance(value, datetime):
            return round(value.timestamp())
        return _seconds(str(value))

    return (
        device,
        row["episode"],
        seconds(row["episode_start"]),
        seconds(row["episode_end"]),
        row["anomalies"],
        row["readings"],
        row["peak_score"],
    )


def _expected_learning(records: list[dict]) -> dict[int, tuple]:
    """(prediction, accuracy, f1, learned) by id: a plain River loop per device."""
    out = {}
    for device in "ab":
        model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
        accuracy, f1, learned = metrics.Accuracy(), metrics.F1(), 0
        for r in (r for r in records if r["device"] == device):
            x = {f: r[f] for f in FIELDS}
            prediction = model.predict_one(x)
            if r["hot"] is not None:
                accuracy.update(r["hot"], prediction)
                f1.update(r["hot"], prediction)
                model.learn_one(x, r["hot"])
                learned += 1
            out[r["id"]] = (prediction, accuracy.get(), f1.get(), learned)
    return out


def test_online_learning_per_key_equals_a_plain_river_loop(spark, nats_url, checkpoints, uid):
    records = _records(500)
    stream = f"IN_{uid}"
    publish(nats_url, stream, f"in{uid}.r", records)
    p = sf.Pipeline(f"learn-{uid}", trigger=0)
    flow = (
        p.source(stream, schema=SCHEMA, key="device", event_time="ts", max_rows_per_batch=60)
        .learn("river:linear_model.LogisticRegression", features=["t", "v"], target="hot")
        .sink_jetstream(f"LEARN_{uid}", subject=f"learn{uid}")
    )
    _run(spark, nats_url, checkpoints, flow, [f"LEARN_{uid}"], len(records))
    rows = read_records(nats_url, f"LEARN_{uid}")
    assert sorted(r["id"] for r in rows) == list(range(len(records)))
    expected = _expected_learning(records)
    for r in rows:
        assert (r["prediction"], r["accuracy"], r["f1"], r["learned"]) == expected[r["id"]], r
        assert 0.5 <= r["probability"] <= 1


def _pipeline(uid: str) -> str:
    return f"""
name: detect-{uid}
trigger: 0s
sources:
  - id: readings
    stream: AD_{uid}
    schema: {{id: long, device: string, ts: timestamp, t: double, v: double, hot: "boolean?"}}
    key: device
    event_time: ts
    max_rows_per_batch: 75
    to: [scores, alarms, model, episodes, shifts]
processors:
  - id: scores
    type: detect_anomalies
    method: likelihood
    fields: [t, v]
    threshold: 0.5
    warmup: 30
    to: [out]
  - id: alarms
    type: detect_anomalies
    method: likelihood
    fields: [t, v]
    warmup: 30
    emit: episodes
    quiet: 20
    to: [alarmed]
  - id: shifts
    type: detect_anomalies
    method: multivariate
    fields: [t, v]
    warmup: 30
    emit: episodes
    quiet: 20
    to: [shifted]
  - id: model
    type: learn
    model: river:linear_model.LogisticRegression
    features: [t, v]
    target: hot
    to: [learnt]
  - id: episodes
    type: pattern
    pattern:
      within: 10m
      skip: skip_past_last_event
      stages:
        - {{stage: warm, where: "t > 20.3", one_or_more: true}}
        - {{stage: low, where: "v < 0.46"}}
    select: {{warmest: "max(warm.t)"}}
    timeouts: true
    to: [matched]
sinks:
  - {{id: out, type: jetstream, stream: SCORES_{uid}, subject: "scores{uid}"}}
  - {{id: alarmed, type: jetstream, stream: ALARMS_{uid}, subject: "alarms{uid}"}}
  - {{id: learnt, type: jetstream, stream: LEARNT_{uid}, subject: "learnt{uid}"}}
  - {{id: matched, type: jetstream, stream: MATCHED_{uid}, subject: "matched{uid}"}}
  - {{id: shifted, type: jetstream, stream: SHIFTS_{uid}, subject: "shifts{uid}"}}
"""


EPISODES = (
    sf.Pattern.begin("warm").where("t > 20.3").one_or_more()
    .followed_by("low").where("v < 0.46")
    .within("10m").skip_past_last_event()
)  # fmt: skip


def _expected_episodes(records: list[dict]) -> Counter:
    """(device, start, end, timed out, warmest) of each match and time-out: the pure
    NFA over each device's events, time moved to the last event at the end."""
    nfa = NFA(EPISODES.spec())
    out: Counter = Counter()
    end = max(r["ts"] for r in records) * 1000
    for device in "ab":
        state = nfa.initial_state()
        found = []
        for r in (r for r in records if r["device"] == device):
            done, late = nfa.advance_time(state, r["ts"] * 1000)
            found += done + late + nfa.process(state, dict(r), r["ts"] * 1000)
        done, late = nfa.advance_time(state, end)
        found += done + late
        for m in found:
            warmest = max(e["t"] for e in m.stages["warm"])
            key = (device, m.start_ts // 1000, m.end_ts // 1000, m.timed_out_at is not None)
            out[(*key, warmest)] += 1
    return out


@pytest.mark.slow
def test_scores_and_learning_after_a_sigkill_and_restart_equal_an_uninterrupted_run(
    nats_url, tmp_path, uid
):
    records = _with_a_fault(_records(900))
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(uid))
    data_dir, log = tmp_path / "node", tmp_path / "run.log"
    publish(nats_url, f"AD_{uid}", f"ad{uid}.r", records[:600])
    proc = _start(pipeline, nats_url, data_dir, log)
    try:
        wait_for(lambda: len(read_all(nats_url, f"SCORES_{uid}")) >= 200, timeout=240)
    except AssertionError:
        proc.kill()
        raise AssertionError(log.read_text()[-3000:]) from None
    _crash(proc)  # mid-stream: some batches written, the rest not
    assert len(read_all(nats_url, f"SCORES_{uid}")) < 600
    publish(nats_url, f"AD_{uid}", f"ad{uid}.r", records[600:])
    episodes = _expected_episodes(records)
    alarms = _expected_alarms(records, 30, 20)
    shifts = _expected_alarms(records, 30, 20, "multivariate")
    proc = _start(pipeline, nats_url, data_dir, log)
    try:
        wait_for(
            lambda: (
                len(read_all(nats_url, f"SCORES_{uid}")) >= len(records)
                and len(read_all(nats_url, f"LEARNT_{uid}")) >= len(records)
                and len(read_all(nats_url, f"MATCHED_{uid}")) >= sum(episodes.values())
                and len(read_all(nats_url, f"ALARMS_{uid}")) >= sum(alarms.values())
                and len(read_all(nats_url, f"SHIFTS_{uid}")) >= sum(shifts.values())
            ),
            timeout=400,  # five queries restarting on a busy 2-core machine: 10-20 s batches
        )
    except AssertionError:
        raise AssertionError(log.read_text()[-3000:]) from None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    rows = read_records(nats_url, f"SCORES_{uid}")
    assert sorted(r["id"] for r in rows) == list(range(len(records)))  # none lost, none twice
    expected = _expected_scores(records, 30)  # likelihood
    for r in rows:
        assert (r["anomaly_score"], r["is_anomaly"], r["anomaly_field"]) == expected[r["id"]]
    # Anomaly episodes: none lost, none twice (the fault is one multivariate episode
    # that lasts: its start and its end)
    assert shifts and max(key[5] for key in shifts) >= 100, shifts  # readings in it
    assert (
        Counter(_alarm_key(r["device"], r) for r in read_records(nats_url, f"SHIFTS_{uid}"))
        == shifts
    )
    assert (
        alarms
        and Counter(_alarm_key(r["device"], r) for r in read_records(nats_url, f"ALARMS_{uid}"))
        == alarms
    )
    learnt = read_records(nats_url, f"LEARNT_{uid}")
    assert sorted(r["id"] for r in learnt) == list(range(len(records)))
    expected_learning = _expected_learning(records)  # a record learnt twice would differ
    for r in learnt:
        assert (r["prediction"], r["accuracy"], r["f1"], r["learned"]) == expected_learning[r["id"]]
    # Partial matches open at the crash were restored: matches and time-outs are the
    # NFA's, none lost, none twice.
    matched = Counter(
        (
            r["device"],
            _seconds(r["match_start"]),
            _seconds(r["match_end"]),
            r["timed_out"],
            r["warmest"],
        )
        for r in read_records(nats_url, f"MATCHED_{uid}")
    )
    assert matched == episodes and any(k[3] for k in episodes) and not all(k[3] for k in episodes)
