"""Versioned rule sets: the manifest decisions, the JetStream store with per-batch
pins, the CLI and REST, rule files, and what a new version does to a key's partial
matches (unchanged rules keep theirs; changed and removed rules lose theirs)."""

from __future__ import annotations

import asyncio
import warnings
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from spanflow.api.patterns import Pattern
from spanflow.api.rules_loader import load_rules_text
from spanflow.cep import rules
from spanflow.cep.processor import PatternMatcher
from spanflow.cep.rule_store import RuleStore, pin_key, version_for_batch, with_store
from spanflow.cep.rules import RuleSetError, RuleSetNotFound
from spanflow.cli import app
from spanflow.errors import PipelineFileError
from tests.cep.test_processor import _Ctx, _Value

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOT = Pattern.begin("hot").where("temperature > 80")
OVERHEAT = HOT.followed_by("drop").where("pressure < 2").within("60s").rule("overheat")
STUCK = (
    Pattern.begin("a").where("temperature = 50").next("b").where("temperature = 50").rule("stuck")
)

RULE_FILE = """\
rules:
  - name: overheat
    pattern:
      within: 60s
      stages:
        - {stage: hot, where: "temperature > 80"}
        - {stage: drop, where: "pressure < 2"}
    select: {peak: "max(hot.temperature)"}
"""


def test_manifest_decisions():
    m = rules.push(None, "plant", [OVERHEAT], now=0.0, note="first")
    m = rules.push(m, "plant", [OVERHEAT, STUCK], now=1.0)
    assert (m.current, m.history) == (2, (1,))
    back = rules.rollback(m)
    assert (back.current, back.history) == (1, ())
    with pytest.raises(RuleSetError, match="nothing to roll back to"):
        rules.rollback(back)
    with pytest.raises(RuleSetError, match=r"rules \['overheat'\] are named twice"):
        rules.push(m, "plant", [OVERHEAT, OVERHEAT], now=2.0)
    with pytest.raises(RuleSetNotFound, match="has no version 9"):
        m.version(9)


def test_store_pins_one_version_per_batch(nats_url, uid):
    name = f"plant-{uid}"

    async def go(store: RuleStore) -> None:
        with pytest.raises(RuleSetNotFound, match="push one"):
            await store.current(name)
        await store.push(name, [OVERHEAT])
        assert (await store.pinned(name, pin_key(f"p-{uid}", "s", "7"))).version == 1
        await store.push(name, [OVERHEAT, STUCK])
        assert (
            await store.pinned(name, pin_key(f"p-{uid}", "s", "7"))
        ).version == 1  # batch 7 keeps v1
        assert (await store.pinned(name, pin_key(f"p-{uid}", "s", "8"))).version == 2
        manifest = await store.rollback(name)
        assert manifest.current == 1 and (await store.current(name)).version == 1

    asyncio.run(with_store(nats_url, go))
    assert version_for_batch(nats_url, name, f"p-{uid}", "s", "8").version == 2  # pinned
    assert version_for_batch(nats_url, name, f"p-{uid}", "s", None).version == 1  # current


def test_cli_push_list_rollback(nats_url, uid, tmp_path):
    name = f"cli-{uid}"
    path = tmp_path / "rules.yaml"
    path.write_text(RULE_FILE)
    runner = CliRunner()
    for _ in range(2):
        result = runner.invoke(
            app, ["rules", "push", str(path), "--name", name, "--nats", nats_url]
        )
        assert result.exit_code == 0, result.output
    assert "version 2 (overheat)" in result.output
    listed = runner.invoke(app, ["rules", "list", name, "--nats", nats_url])
    assert listed.exit_code == 0 and "overheat" in listed.output
    back = runner.invoke(app, ["rules", "rollback", name, "--nats", nats_url])
    assert back.exit_code == 0 and "version 1 is current again" in back.output
    path.write_text(RULE_FILE.replace("pressure < 2", "pressure <"))
    bad = runner.invoke(app, ["rules", "push", str(path), "--name", name, "--nats", nats_url])
    assert bad.exit_code != 0


def test_rule_files_name_the_line_and_field():
    assert [r.name for r in load_rules_text(RULE_FILE, "r.yaml")] == ["overheat"]
    broken = RULE_FILE.replace('"pressure < 2"', '"pressure < first(cold.p)"')
    with pytest.raises(PipelineFileError, match=r"r.yaml:\d+: rules\[0\].pattern: stage 'drop'"):
        load_rules_text(broken, "r.yaml")
    with pytest.raises(PipelineFileError, match="rules"):
        load_rules_text("rules: []\n", "r.yaml")


def test_rest_endpoints(tmp_path):
    from spanflow.nats.server import EmbeddedNats
    from spanflow.server.app import create_app
    from tests.cluster.test_coordinator_api import AUTH, coordinator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    body = {"rules": [OVERHEAT.model_dump(mode="json")], "note": "v1"}
    with (
        EmbeddedNats(tmp_path / "nats") as server,
        TestClient(create_app(coordinator(server, tmp_path))) as api,
    ):
        assert api.post("/api/v1/rules/plant", json=body).status_code == 401
        r = api.post("/api/v1/rules/plant", json=body, headers=AUTH)
        assert r.status_code == 201 and r.json()["version"] == 1
        body["rules"].append(STUCK.model_dump(mode="json"))
        assert api.post("/api/v1/rules/plant", json=body, headers=AUTH).json()["version"] == 2
        assert api.get("/api/v1/rules/plant", headers=AUTH).json()["current"] == 2
        assert api.post("/api/v1/rules/plant/rollback", headers=AUTH).json()["current"] == 1
        assert [m["name"] for m in api.get("/api/v1/rules", headers=AUTH).json()] == ["plant"]
        assert api.get("/api/v1/rules/none", headers=AUTH).status_code == 404
        bad = {"rules": [{"name": "x", "pattern": {"stages": [{"name": "a", "where": "t >"}]}}]}
        r = api.post("/api/v1/rules/plant", json=bad, headers=AUTH)
        assert r.status_code == 422 and "not a SQL expression" in r.text


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_new_version_keeps_the_partial_matches_of_unchanged_rules_only():
    """v1: overheat + stuck. A hot event and a 50-degree event open a partial match
    in each. v2 keeps overheat as it was, changes stuck: overheat still completes
    with the hot event of v1's time; stuck starts over."""
    state = _Value()
    v1 = PatternMatcher(event_time="ts", rules=[OVERHEAT, STUCK], version=1)
    v1.state = state  # type: ignore[assignment]
    first = [{"device": "a", "ts": _at(1), "temperature": 90.0, "pressure": 5.0},
             {"device": "a", "ts": _at(2), "temperature": 50.0, "pressure": 5.0}]  # fmt: skip
    list(v1.process("a", first, _Ctx(None)))  # type: ignore[arg-type]
    assert list(v1.on_timer("a", _at(2), _Ctx(_at(2)))) == []  # type: ignore[arg-type]

    stuck2 = (
        Pattern.begin("a").where("temperature = 50").next("b").where("temperature >= 40")
    ).rule("stuck")
    v2 = PatternMatcher(event_time="ts", rules=[OVERHEAT, stuck2], version=2)
    v2.state = state  # type: ignore[assignment]
    later = [{"device": "a", "ts": _at(3), "temperature": 50.0, "pressure": 1.0}]
    list(v2.process("a", later, _Ctx(_at(2))))  # type: ignore[arg-type]
    rows = list(v2.on_timer("a", _at(3), _Ctx(_at(3))))  # type: ignore[arg-type]
    got = sorted((r["rule"], r["version"], r["match_start"]) for r in rows)
    # overheat: hot at 1 s (kept from v1) then the drop at 3 s; stuck (its second stage
    # changed) lost its 2 s partial match, so 2 s + 3 s is no match, and 3 s alone is
    # not two events.
    assert got == [("overheat", 2, _at(1))]
    assert '"peak"' not in rows[0]["values"] and "hot_count" in rows[0]["values"]


def _upgraded(old_rule, new_rule, first: list[dict], later: list[dict]) -> list[tuple]:
    """Matches of ``new_rule`` after ``old_rule`` took ``first`` (fixed rules, as in a
    pipeline upgraded on its checkpoint): (match_start, match_end) per match."""
    state = _Value()
    v1 = PatternMatcher(event_time="ts", rules=[old_rule])
    v1.state = state  # type: ignore[assignment]
    list(v1.process("a", first, _Ctx(None)))  # type: ignore[arg-type]
    end = first[-1]["ts"]
    list(v1.on_timer("a", end, _Ctx(end)))  # type: ignore[arg-type]
    v2 = PatternMatcher(event_time="ts", rules=[new_rule])
    v2.state = state  # type: ignore[assignment]
    list(v2.process("a", later, _Ctx(end)))  # type: ignore[arg-type]
    last = later[-1]["ts"]
    rows = list(v2.on_timer("a", last, _Ctx(last)))  # type: ignore[arg-type]
    return sorted((r["match_start"], r["match_end"]) for r in rows)


def _reading(second: int, temperature: float, pressure: float = 5.0) -> dict:
    return {"device": "a", "ts": _at(second), "temperature": temperature, "pressure": pressure}


def test_a_stage_appended_to_a_rule_carries_its_partial_matches_on():
    """v1 took the hot reading at 1 s and waits for a drop; v2 appends a calm stage:
    the match begun under v1 completes under v2 (hot 1 s, drop 3 s, calm 4 s)."""
    hot_drop = HOT.followed_by("drop").where("pressure < 2").within("60s")
    longer = hot_drop.followed_by("calm").where("temperature < 40")
    later = [_reading(3, 50.0, 1.0), _reading(4, 30.0)]
    got = _upgraded(hot_drop.rule("r"), longer.rule("r"), [_reading(1, 90.0)], later)
    assert got == [(_at(1), _at(4))]
    # new selections keep the partial matches too
    selected = hot_drop.rule("r", select={"peak": "max(hot.temperature)"})
    assert _upgraded(hot_drop.rule("r"), selected, [_reading(1, 90.0)], later[:1]) == [
        (_at(1), _at(3))
    ]


@pytest.mark.parametrize(
    "changed",
    [
        HOT.followed_by("drop").where("pressure < 3").within("60s").followed_by("calm"),
        HOT.followed_by("drop").where("pressure < 2").within("30s").followed_by("calm"),
    ],
)
def test_a_rule_whose_old_stages_or_bounds_changed_starts_again(changed):
    hot_drop = HOT.followed_by("drop").where("pressure < 2").within("60s")
    later = [_reading(3, 50.0, 1.0), _reading(4, 30.0)]
    assert _upgraded(hot_drop.rule("r"), changed.rule("r"), [_reading(1, 90.0)], later) == []


def test_stages_appended_after_a_looping_stage_start_again():
    """A partial match in a loop means another thing once stages follow the loop."""
    loop = HOT.followed_by("drop").where("pressure < 2").one_or_more().within("60s")
    first = [_reading(1, 90.0), _reading(2, 50.0, 1.0)]
    got = _upgraded(loop.rule("r"), loop.followed_by("calm").rule("r"), first, [_reading(4, 30.0)])
    assert got == []
