"""The pattern step's keyed processor without Spark (spanflow.testing's harness):
event-time order from out-of-order batches, late events dead-lettered, within and
trailing not_followed_by completing on timers, one state value per key."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from spanflow.api.patterns import Pattern
from spanflow.cep.nfa import NFA
from spanflow.cep.processor import PatternMatcher
from spanflow.testing import KeyedProcessorTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)

HOT_THEN_DROP = (
    Pattern.begin("hot").where("temperature > 80")
    .followed_by("drop").where("pressure < 2")
    .within("30s")
)  # fmt: skip


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


SCHEMA = {
    "device": "string",
    "rule": "string",
    "match_start": "timestamp",
    "match_end": "timestamp",
    "timed_out": "boolean",
    "hot_count": "long?",
    "drop_count": "long?",
    "cool_count": "long?",
    "hotter_count": "long?",
    "peak": "double?",
}


def harness(
    pattern: Pattern,
    select: dict[str, str] | None = None,
    timeouts: bool = False,
    schema: dict[str, str] = SCHEMA,
    **params: object,
) -> KeyedProcessorTest:
    rule = pattern.rule("overheat", select=select, timeouts=timeouts)
    return KeyedProcessorTest(
        PatternMatcher,
        key="device",
        event_time="ts",
        output_schema=schema,
        params={"event_time": "ts", "rules": [rule], "timestamps": ("ts",), **params},
    )


def readings(n: int, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append(
            {
                "id": i,
                "device": rng.choice("ab"),
                "ts": at(i * 2.0),
                "temperature": rng.choice([60.0, 70.0, 85.0, 90.0]),
                "pressure": rng.choice([1.0, 3.0, 5.0, 5.0]),
            }
        )
    return out


def expected_matches(pattern: Pattern, events: list[dict]) -> list[tuple[str, datetime, datetime]]:
    """(device, start, end) of every match: the pure NFA over each key's sorted events,
    time advanced as the watermark would (before each event, then past the end)."""
    out = []
    nfa = NFA(pattern.spec())
    for device in "ab":
        state = nfa.initial_state()
        mine = sorted((e for e in events if e["device"] == device), key=lambda e: e["ts"])
        for e in mine:
            ms = round(e["ts"].timestamp() * 1000)
            done, _ = nfa.advance_time(state, ms)
            found = done + nfa.process(state, dict(e), ms)
            out += [(device, m.start_ts, m.end_ts) for m in found]
        done, _ = nfa.advance_time(state, round(at(10_000).timestamp() * 1000))
        out += [(device, m.start_ts, m.end_ts) for m in done]
    return sorted(
        (d, datetime.fromtimestamp(s / 1000, UTC), datetime.fromtimestamp(e / 1000, UTC))
        for d, s, e in out
    )


def test_out_of_order_batches_give_the_matches_of_event_time_order():
    events = readings(300)
    shuffled = events[:]
    random.Random(5).shuffle(shuffled)
    t = harness(HOT_THEN_DROP)
    rows: list[dict] = []
    # batches of 30 shuffled events; the watermark trails by the batch's whole range
    for lo in range(0, len(shuffled), 30):
        rows += t.process(shuffled[lo : lo + 30])
    rows += t.advance_watermark(at(10_000))
    got = sorted((r["device"], r["match_start"], r["match_end"]) for r in rows)
    assert got == expected_matches(HOT_THEN_DROP, events)
    assert got and all(r["rule"] == "overheat" and r["hot_count"] == 1 for r in rows)
    assert not t.dead_letters


def test_matches_come_out_when_the_watermark_passes_them():
    t = harness(HOT_THEN_DROP)
    hot = {"device": "a", "ts": at(1), "temperature": 90.0, "pressure": 5.0}
    drop = {"device": "a", "ts": at(5), "temperature": 70.0, "pressure": 1.0}
    assert t.process([hot, drop]) == []
    assert t.advance_watermark(at(4)) == []  # the drop at 5 s is not final yet
    rows = t.advance_watermark(at(5))
    assert [(r["match_start"], r["match_end"]) for r in rows] == [(at(1), at(5))]


class _Ctx:
    """The least a call needs: a watermark, timers and rejects (Spark's harness drops
    late rows before the processor, as Spark would for a watermarked column; spanflow
    hands them over so they can be dead-lettered: see spanflow.spark.compile.patterns)."""

    def __init__(self, watermark: datetime | None) -> None:
        self.watermark = watermark
        self.rejected: list[tuple[dict, str]] = []
        self.timers = self
        self.registered: list[datetime] = []

    def list(self) -> list[datetime]:
        return self.registered

    def register(self, when: datetime) -> None:
        self.registered.append(when)

    def reject(self, record: dict, reason: str) -> None:
        self.rejected.append((record, reason))


class _Value:
    def __init__(self) -> None:
        self.value: object = None

    def get(self, default: object = None) -> object:
        return self.value if self.value is not None else default

    def set(self, value: object) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


def test_late_events_are_rejected_with_the_reason():
    rules = [HOT_THEN_DROP.rule("overheat")]
    matcher = PatternMatcher(event_time="ts", rules=rules, timestamps=("ts",))
    matcher.state = _Value()  # type: ignore[assignment]
    ctx = _Ctx(watermark=at(20))
    late = {"device": "a", "ts": at(15), "temperature": 70.0, "pressure": 1.0}
    fresh = {"device": "a", "ts": at(25), "temperature": 90.0, "pressure": 1.0}
    assert list(matcher.process("a", [late, fresh], ctx)) == []  # type: ignore[arg-type]
    assert len(ctx.rejected) == 1 and ctx.rejected[0][0] is late
    assert "is not after the watermark" in ctx.rejected[0][1]
    assert ctx.registered == [at(25)]  # a timer for the buffered event


def test_within_times_out_on_a_timer_without_new_events():
    t = harness(HOT_THEN_DROP, timeouts=True)
    t.process([{"device": "a", "ts": at(0), "temperature": 90.0, "pressure": 5.0}])
    t.advance_watermark(at(1))  # the hot event is processed; its deadline is 30 s
    assert t.advance_watermark(at(29)) == []
    rows = t.advance_watermark(at(30))
    assert [(r["timed_out"], r["match_start"], r["hot_count"]) for r in rows] == [(True, at(0), 1)]
    assert t.state("cep", "a") is None  # nothing left for the key


def test_trailing_not_followed_by_matches_when_within_runs_out():
    quiet = (
        Pattern.begin("hot").where("temperature > 80")
        .not_followed_by("cool").where("temperature < 50")
        .within("10s")
    )  # fmt: skip
    t = harness(quiet, select={"peak": "max(hot.temperature)"})
    t.process([{"device": "a", "ts": at(0), "temperature": 90.0, "pressure": 5.0},
               {"device": "b", "ts": at(0), "temperature": 95.0, "pressure": 5.0},
               {"device": "b", "ts": at(4), "temperature": 40.0, "pressure": 5.0}])  # fmt: skip
    assert t.advance_watermark(at(9)) == []
    rows = t.advance_watermark(at(10))
    assert [(r["device"], r["peak"]) for r in rows] == [("a", 90.0)]  # b cooled down in time


GATED = [
    Pattern.begin("hot").where("temperature > 80").followed_by("drop").where("pressure < 2"),
    Pattern.begin("hot").where("temperature > 80").optional()
    .followed_by("drop").where("pressure < 2").within("20s"),
    Pattern.begin("hot").where("temperature > 80").one_or_more().until("pressure < 2")
    .followed_by("cool").where("temperature < 65").within("30s").skip_past_last_event(),
    Pattern.begin("hot").where("temperature > 80").not_followed_by("cool")
    .where("temperature < 65").within("10s"),
    Pattern.begin("hot").where("temperature > 80").next("hotter")
    .where("temperature > first(hot.temperature)").skip_to_next(),
]  # fmt: skip


def test_feeding_only_events_that_pass_the_start_gate_changes_no_match():
    """An idle rule skips events that cannot start a match (spanflow.spec.patterns.gate):
    the processor's matches equal the plain NFA's over every event."""
    events = [e for e in readings(400, seed=9) if e["device"] == "a"]
    for i, pattern in enumerate(GATED):
        t = harness(pattern, timeouts=True)
        rows = []
        for lo in range(0, len(events), 25):
            rows += t.process(events[lo : lo + 25])
        rows += t.advance_watermark(at(10_000))
        got = sorted((r["match_start"], r["match_end"], r["timed_out"]) for r in rows)
        want = nfa_matches(pattern, events, at(10_000))
        assert got == want and want, i


MANY = [
    *GATED,
    Pattern.begin("hot").where("temperature > 70").followed_by_any("drop").where("pressure < 2")
    .within("15s"),
    Pattern.begin("hot").where("temperature >= 85").times(2).consecutive()
    .followed_by("drop").where("pressure <= 1"),
    Pattern.begin("low").where("pressure < 3").followed_by("hot").where("temperature > 85")
    .within("10s").skip_to_first("hot"),
    Pattern.begin("any").where("temperature > 80 OR pressure < 2").next("calm")
    .where("pressure > 4"),
    Pattern.begin("first").followed_by("hot").where("temperature > 85").within("6s")
    .skip_past_last_event(),
]  # fmt: skip


def nfa_matches(pattern: Pattern, events: list[dict], end: datetime) -> list[tuple]:
    """(start, end, timed out) of every match: the pure NFA fed every event."""
    nfa = NFA(pattern.spec())
    state = nfa.initial_state()
    found = []
    for e in events:
        ms = round(e["ts"].timestamp() * 1000)
        done, late = nfa.advance_time(state, ms)
        found += done + late + nfa.process(state, dict(e), ms)
    done, late = nfa.advance_time(state, round(end.timestamp() * 1000))
    found += done + late
    return sorted(
        (
            datetime.fromtimestamp(m.start_ts / 1000, UTC),
            datetime.fromtimestamp(m.end_ts / 1000, UTC),
            m.timed_out_at is not None,
        )
        for m in found
    )


def test_many_rules_in_one_step_find_what_each_nfa_finds_alone():
    """Rules share a step: each event goes only to the rules it can change (the filter
    index of start gates, the NFA's unchanged check) — the matches of every rule are
    still those of its NFA fed every event."""
    events = [e for e in readings(600, seed=5) if e["device"] == "a"]
    t = KeyedProcessorTest(
        PatternMatcher,
        key="device",
        event_time="ts",
        output_schema={
            **SCHEMA,
            **{f"{s}_count": "long?" for s in ("low", "any", "calm", "first")},
        },
        params={
            "event_time": "ts",
            "rules": [p.rule(f"r{i}", timeouts=True) for i, p in enumerate(MANY)],
            "timestamps": ("ts",),
        },
    )
    rows = []
    for lo in range(0, len(events), 40):
        rows += t.process(events[lo : lo + 40])
    end = at(100_000)
    rows += t.advance_watermark(end)
    assert not t.dead_letters
    for i, pattern in enumerate(MANY):
        got = sorted(
            (r["match_start"], r["match_end"], r["timed_out"]) for r in rows if r["rule"] == f"r{i}"
        )
        want = nfa_matches(pattern, events, end)
        assert got == want and want, i
