"""The agent's reconciliation decision with plain values and a fake clock."""

from __future__ import annotations

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.runtime.reconcile import (
    Failure,
    Forget,
    Savepoint,
    Start,
    Stop,
    reconcile,
    savepoint_marker,
)
from spanflow.spec.cluster import Assignment, Fragment

SPEC = load_pipeline_text(
    """
name: p
sources: [{id: s, stream: IN, schema: {v: long}, to: [out]}]
sinks: [{id: out, type: jetstream, stream: OUT, subject: out}]
""",
    "p.yaml",
)


def assigned(fid: str, epoch: int, **extra: object) -> Assignment:
    fragment = Fragment(id=fid, pipeline="p", spec=SPEC)
    return Assignment(fragment=fragment, node="n1", epoch=epoch, checkpoint_dir="/c", **extra)


def test_start_what_is_assigned_and_stop_what_is_not() -> None:
    desired = {"p.f0": assigned("p.f0", 1)}
    actions = reconcile(desired, {"p.old": 3}, {}, set(), {"p.old", "p.gone"}, now=0.0)
    assert actions == [Stop("p.old"), Forget("p.gone"), Start(desired["p.f0"])]
    assert reconcile(desired, {"p.f0": 1}, {}, set(), {"p.f0"}, now=0.0) == []


def test_a_new_epoch_replaces_the_running_one() -> None:
    desired = {"p.f0": assigned("p.f0", 2)}
    assert reconcile(desired, {"p.f0": 1}, {}, set(), set(), now=0.0) == [Start(desired["p.f0"])]


def test_a_passing_failure_is_retried_after_the_pause_a_fatal_one_never() -> None:
    desired = {"p.f0": assigned("p.f0", 4)}
    passing = {"p.f0": Failure(epoch=4, at=100.0, fatal=False)}
    assert reconcile(desired, {}, passing, set(), set(), now=104.9) == []
    assert reconcile(desired, {}, passing, set(), set(), now=105.0) == [Start(desired["p.f0"])]
    fatal = {"p.f0": Failure(epoch=4, at=100.0, fatal=True)}
    assert reconcile(desired, {}, fatal, set(), set(), now=10_000.0) == []
    newer = {"p.f0": assigned("p.f0", 5)}  # a new epoch gets a new chance
    assert reconcile(newer, {}, fatal, set(), set(), now=100.1) == [Start(newer["p.f0"])]


def test_a_savepoint_is_taken_once_per_epoch_and_target() -> None:
    a = assigned("p.f0", 2, action="savepoint", savepoint_dir="/sp/1")
    desired = {"p.f0": a}
    assert reconcile(desired, {"p.f0": 2}, {}, set(), set(), now=0.0) == [Savepoint(a)]
    done = {savepoint_marker(a)}
    assert reconcile(desired, {"p.f0": 2}, {}, done, set(), now=0.0) == []
    again = assigned("p.f0", 2, action="savepoint", savepoint_dir="/sp/2")
    assert reconcile({"p.f0": again}, {}, {}, done, set(), now=0.0) == [Savepoint(again)]
