"""Event patterns on real Spark and NATS: the matches and time-outs of each key equal
the pure NFA's over the key's events in event-time order, whatever the micro-batches;
an event that arrives behind the watermark goes to the dead letters with the reason."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import UTC, datetime

import orjson

import spanflow as sf
from spanflow.cep.nfa import NFA
from tests.helpers import publish, read_all, read_records, wait_for

BASE = 1_800_000_000
SCHEMA = {"id": "long", "device": "string", "ts": "timestamp", "temperature": "double",
          "pressure": "double"}  # fmt: skip
HOT_THEN_DROP = (
    sf.Pattern.begin("hot").where("temperature > 80")
    .followed_by("drop").where("pressure < 2")
    .within("30s")
)  # fmt: skip


def _readings(n: int) -> list[dict]:
    rng = random.Random(8)
    return [
        {
            "id": i,
            "device": "ab"[rng.random() < 0.5],
            "ts": BASE + i * 4,
            "temperature": rng.choice([60.0, 70.0, 85.0, 90.0]),
            "pressure": rng.choice([1.0, 3.0, 5.0, 5.0]),
        }
        for i in range(n)
    ]


def _expected(records: list[dict], end: int) -> list[tuple]:
    """(device, start, end, timed_out, peak) per match: the pure NFA per device."""
    nfa = NFA(HOT_THEN_DROP.spec())
    out = []
    for device in "ab":
        state = nfa.initial_state()
        found = []
        for r in (r for r in records if r["device"] == device):
            done, late = nfa.advance_time(state, r["ts"] * 1000)
            found += done + late
            found += nfa.process(state, dict(r), r["ts"] * 1000)
        done, late = nfa.advance_time(state, end * 1000)
        found += done + late
        for m in found:
            peak = max(e["temperature"] for e in m.stages["hot"])
            timed_out = m.timed_out_at is not None
            out.append((device, m.start_ts // 1000, m.end_ts // 1000, timed_out, peak))
    return sorted(out)


def _seconds(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp())


def test_matches_and_timeouts_equal_the_nfa_and_late_events_are_dead_lettered(
    spark, nats_url, checkpoints, uid
):
    records = _readings(240)
    flush = {"id": 999, "device": "z", "ts": BASE + 4000, "temperature": 0.0, "pressure": 9.0}
    late = {"id": 1000, "device": "a", "ts": BASE + 10, "temperature": 99.0, "pressure": 1.0}
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", [*records, flush])
    flow = (
        sf.Pipeline(f"cep-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, key="device", event_time="ts", max_rows_per_batch=37)
        .match(
            HOT_THEN_DROP,
            select={"peak": "max(hot.temperature)"},
            timeouts=True,
            rule="overheat",
            id="overheat",
        )
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    expected = _expected(records, flush["ts"])
    from spanflow.spark.runner import PipelineRunner

    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions={}
    ).start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"OUT_{uid}")) >= len(expected), timeout=120)
        runner.await_idle()
        publish(nats_url, f"IN_{uid}", f"in{uid}.r", [late])
        wait_for(lambda: len(_letters(nats_url, uid)) >= 1, timeout=60)
        runner.await_idle()
    finally:
        runner.stop()
    rows = read_records(nats_url, f"OUT_{uid}")
    got = sorted(
        (
            r["device"],
            _seconds(r["match_start"]),
            _seconds(r["match_end"]),
            r["timed_out"],
            r["peak"],
        )
        for r in rows
    )
    assert got == expected
    assert {r["rule"] for r in rows} == {"overheat"}
    assert any(t for *_, t, _ in expected) and not all(t for *_, t, _ in expected)
    letters = _letters(nats_url, uid)
    assert len(letters) == 1
    assert "is not after the watermark" in letters[0]["Spanflow-Reason"]


def _letters(nats_url: str, uid: str) -> list[dict]:
    return [
        h for h, _, s in read_all(nats_url, "SPANFLOW_DLQ") if s.endswith(f"cep-{uid}.overheat")
    ]


STUCK = (
    sf.Pattern.begin("a").where("pressure = 5.0").next("b").where("pressure = 5.0")
    .next("c").where("pressure = 5.0")
)  # fmt: skip


def _nfa_matches(pattern: sf.Pattern, records: list[dict], end: int) -> Counter[tuple]:
    """(device, start s, end s) of each match of ``pattern`` over each device's events."""
    nfa = NFA(pattern.spec())
    out: Counter[tuple] = Counter()
    for device in "ab":
        state = nfa.initial_state()
        for r in (r for r in records if r["device"] == device):
            out.update((device, m.start_ts // 1000, m.end_ts // 1000)
                       for m in nfa.advance_time(state, r["ts"] * 1000)[0])  # fmt: skip
            out.update((device, m.start_ts // 1000, m.end_ts // 1000)
                       for m in nfa.process(state, dict(r), r["ts"] * 1000))  # fmt: skip
        out.update((device, m.start_ts // 1000, m.end_ts // 1000)
                   for m in nfa.advance_time(state, end * 1000)[0])  # fmt: skip
    return out


def test_a_new_rule_set_version_applies_while_running_and_unchanged_rules_lose_nothing(
    spark, nats_url, checkpoints, uid
):
    """v1: overheat + stuck; v2 (pushed while the query runs): overheat unchanged,
    stuck replaced by 'cold'. Overheat's matches over the whole stream are exactly the
    NFA's — none lost or doubled at the switch; stuck's rows say version 1, cold's 2."""
    from spanflow.cep.rule_store import with_store

    records = _readings(600)
    flush = {"id": 9999, "device": "z", "ts": BASE + 10_000, "temperature": 0.0, "pressure": 9.0}
    overheat = HOT_THEN_DROP.rule("overheat", select={"peak": "max(hot.temperature)"})
    cold = sf.Pattern.begin("c").where("temperature < 65").rule("cold")
    name = f"plant-{uid}"

    async def push(rules: list) -> None:  # type: ignore[type-arg]
        await with_store(nats_url, lambda store: store.push(name, rules))

    asyncio.run(push([overheat, STUCK.rule("stuck")]))
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", records[:300])
    flow = (
        sf.Pipeline(f"live-{uid}", trigger=0)
        .source(f"IN_{uid}", schema=SCHEMA, key="device", event_time="ts", max_rows_per_batch=25)
        .match(rule_set=name, id="rules")
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    from spanflow.spark.runner import PipelineRunner

    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions={}
    ).start()
    try:
        wait_for(lambda: len(read_all(nats_url, f"OUT_{uid}")) >= 20, timeout=120)
        asyncio.run(push([overheat, cold]))  # mid-stream
        publish(nats_url, f"IN_{uid}", f"in{uid}.r", [*records[300:], flush])
        expected = _nfa_matches(HOT_THEN_DROP, records, flush["ts"])

        def overheats() -> list[dict]:
            return [r for r in read_records(nats_url, f"OUT_{uid}") if r["rule"] == "overheat"]

        wait_for(lambda: len(overheats()) >= sum(expected.values()), timeout=180)
        runner.await_idle()
    finally:
        runner.stop()
    rows = read_records(nats_url, f"OUT_{uid}")
    got = Counter(
        (r["device"], _seconds(r["match_start"]), _seconds(r["match_end"]))
        for r in rows
        if r["rule"] == "overheat"
    )
    assert got == expected
    versions = {(r["rule"], r["version"]) for r in rows}
    assert {v for rule, v in versions if rule == "stuck"} == {1}
    assert {v for rule, v in versions if rule == "cold"} == {2}
    assert {v for rule, v in versions if rule == "overheat"} == {1, 2}
    assert all(
        orjson.loads(r["values"]).keys() == {"peak"} for r in rows if r["rule"] == "overheat"
    )
