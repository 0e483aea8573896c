"""Event patterns on real Spark and NATS: the matches and time-outs of each key equal
the pure NFA's over the key's events in event-time order, whatever the micro-batches;
an event that arrives behind the watermark goes to the dead letters with the reason."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import spanflow as sf
from spanflow.cep.nfa import NFA
from tests.helpers import publish, read_all, read_records, run_until

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
    rows = run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", len(expected))
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

    publish(nats_url, f"IN_{uid}", f"in{uid}.r", [late])
    run_until(spark, nats_url, checkpoints, flow, f"OUT_{uid}", len(expected))
    letters = [
        h for h, _, s in read_all(nats_url, "SPANFLOW_DLQ") if s.endswith(f"cep-{uid}.overheat")
    ]
    assert len(letters) == 1
    assert "is not after the watermark" in letters[0]["Spanflow-Reason"]
    assert len(read_records(nats_url, f"OUT_{uid}")) == len(expected)
