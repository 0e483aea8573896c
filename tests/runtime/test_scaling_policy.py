"""The scaling policy of a node on a Spark cluster, on a fake clock: out after sustained
pressure, in after a longer quiet, bounds, cooldown and hysteresis."""

from __future__ import annotations

import pytest

from spanflow.runtime.load import FragmentLoad
from spanflow.runtime.scaling.policy import Scaler, ScalingConfig

CONFIG = ScalingConfig(min_executors=1, max_executors=3, sustain_out=10, sustain_in=60, cooldown=30)


def behind(batch_ms: int = 2500, backlog: int = 0) -> list[FragmentLoad]:
    """A fragment whose batches take ``batch_ms`` on a 1 s trigger."""
    return [FragmentLoad("p.f0", batch_ms, 1000, 500.0, 500.0, backlog)]


def idle() -> list[FragmentLoad]:
    return [FragmentLoad("p.f0", 50, 1000, 0.0, 0.0, 0)]


def run(  # type: ignore[no-untyped-def]
    scaler: Scaler, executors: int, loads: list[FragmentLoad], start: float, end: float
):
    """Observe once a second; the decisions, applied as the agent applies them (the
    clock starts again after a decision: the next one counts from the next second)."""
    decisions = []
    for now in range(int(start), int(end)):
        d = scaler.observe(float(now), executors, loads)
        if d is not None:
            decisions.append((now, d))
            executors = d.target
    return decisions, executors


def test_sustained_pressure_scales_out_one_step_per_cooldown_up_to_the_maximum():
    scaler = Scaler(CONFIG)
    decisions, executors = run(scaler, 1, behind(), 0, 200)
    assert [(t, d.current, d.target) for t, d in decisions] == [(10, 1, 2), (40, 2, 3)]
    assert executors == 3
    assert decisions[0][1].out
    assert decisions[0][1].reason == "batch pressure 2.50 in p.f0 above 1 for 10 s"


def test_a_burst_shorter_than_sustain_changes_nothing():
    scaler = Scaler(CONFIG)
    assert run(scaler, 1, behind(), 0, 9)[0] == []
    assert run(scaler, 1, idle(), 9, 12)[0] == []  # the pressure fell: the clock restarts
    assert run(scaler, 1, behind(), 12, 21)[0] == []


def test_a_growing_backlog_alone_is_pressure():
    # batches on time, but 30 s of pending input at 500 rows/s: three times the budget
    scaler = Scaler(CONFIG)
    decisions, _ = run(scaler, 1, behind(batch_ms=300, backlog=15_000), 0, 20)
    assert decisions and "backlog pressure" in decisions[0][1].reason


def test_quiet_scales_in_after_the_longer_sustain_down_to_the_minimum():
    scaler = Scaler(CONFIG)
    decisions, executors = run(scaler, 3, idle(), 0, 300)
    assert [(t, d.current, d.target) for t, d in decisions] == [(60, 3, 2), (121, 2, 1)]
    assert executors == 1
    assert not decisions[0][1].out


def test_between_the_thresholds_nothing_moves():
    scaler = Scaler(CONFIG)
    assert run(scaler, 2, behind(batch_ms=600), 0, 600)[0] == []


def test_after_a_scale_out_a_quiet_spell_inside_the_cooldown_does_not_undo_it():
    scaler = Scaler(CONFIG)
    _decisions, executors = run(scaler, 1, behind(), 0, 11)
    assert executors == 2
    # idle from 11 s: in needs 60 s of quiet, counted from when the quiet began
    later, executors = run(scaler, executors, idle(), 11, 100)
    assert [(t, d.target) for t, d in later] == [(71, 1)]


def test_equal_bounds_never_scale_and_bad_bounds_are_refused():
    fixed = Scaler(ScalingConfig(min_executors=2, max_executors=2, sustain_out=1))
    assert run(fixed, 2, behind(), 0, 100)[0] == []
    with pytest.raises(ValueError, match="need 1 <= min <= max"):
        ScalingConfig(min_executors=3, max_executors=2)
    with pytest.raises(ValueError, match="must be below"):
        ScalingConfig(max_executors=2, in_at=1.0, out_at=1.0)
