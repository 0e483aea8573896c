"""Pipelines room: the lifecycle of submitted pipelines (``spec.cluster.TRANSITIONS``).

Pure decisions over a :class:`~spanflow.control.state.Draft`; placing fragments is the
scheduler's, noticing what runs is the reconciler's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from spanflow.control import drains, fleet
from spanflow.control import records as r
from spanflow.control.errors import Conflict, Invalid, NotFound
from spanflow.control.requests import Submission
from spanflow.control.state import ClusterState, Draft
from spanflow.ml.rebaseline import EVERY_KEY, key_text
from spanflow.plan import PlacementError
from spanflow.plan.fragments import PlanError, compile_fragments
from spanflow.plan.planner import offline_view, plan_pipeline
from spanflow.spec import locations
from spanflow.spec.cluster import TRANSITIONS, Fragment, PipelineRecord, PipelineState
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.models import DetectAnomaliesStep
from spanflow.spec.upgrade import (
    StepUpgrade,
    UpgradeRefused,
    UpgradeReport,
    Verdict,
    can_name_sources,
    check_upgrade,
    stateful_steps,
)

MAX_KEY_TEXT = 256

log = logging.getLogger(__name__)

ACTIVE = (
    PipelineState.CREATED,
    PipelineState.PLANNED,
    PipelineState.RUNNING,
    PipelineState.FAILING,
)
"""States in which a pipeline's fragments should be placed and running."""

_ENDINGS: dict[PipelineState, type[r.PipelineEnded]] = {
    PipelineState.CANCELED: r.PipelineCanceled,
    PipelineState.FINISHED: r.PipelineFinished,
    PipelineState.FAILED: r.PipelineFailed,
    PipelineState.STOPPED: r.PipelineStopped,
}


def pipeline(state: ClusterState, name: str) -> PipelineRecord:
    record = state.pipelines.get(name)
    if record is None:
        raise NotFound("no_pipeline", f"no pipeline {name!r}")
    return record


def fragments(state: ClusterState, record: PipelineRecord) -> list[Fragment]:
    """The record's plan; a pipeline not planned yet is compiled for today's topology."""
    if record.fragments:
        return record.fragments
    compiled = compile_fragments(record.spec, state.full_topology(), record.parallelism)
    return with_standby(compiled.fragments, record.spec.standby)


def with_standby(planned: list[Fragment], standby: int) -> list[Fragment]:
    """Each planned fragment followed by its ``standby`` hot standby replicas."""
    return [f.as_replica(n) for f in planned for n in range(standby + 1)]


def shown_fragments(state: ClusterState, record: PipelineRecord) -> list[Fragment]:
    try:
        return fragments(state, record)
    except PlanError:
        return []


def submit(tx: Draft, sub: Submission, run_id: str) -> PipelineRecord:
    """Accept a pipeline (its spec already pinned to what its models need)."""
    name = sub.spec.name
    secrets = sub.spec.inline_secrets()
    if secrets:
        raise Invalid(
            "inline_secret",
            f"pipeline {name!r} holds secrets in its spec ({'; '.join(secrets)}): name "
            "environment variables instead, read where the query runs; a spec is stored "
            "in the control log and shown by the API",
        )
    old = tx.state.pipelines.get(name)
    if old is not None and not old.state.terminal and old.state != PipelineState.STOPPED:
        raise Conflict(
            "pipeline_active",
            f"pipeline {name!r} is {old.state.value}; cancel it before resubmitting",
        )
    record = PipelineRecord(
        spec=sub.spec,
        priority=sub.priority,
        latency_budget=sub.latency_budget,
        parallelism=sub.parallelism,
        submitted_at=tx.at,
        run_id=run_id,
        named_sources=True,
    ).moved_to(PipelineState.CREATED, "submitted", tx.at)
    check_plannable(tx.state, record)
    tx.add(r.PipelineSubmitted, pipeline=record)
    return record


def check_plannable(state: ClusterState, record: PipelineRecord) -> None:
    """Refuse a pipeline no placement could ever fit (a bad pin, a latency budget or
    capability no declared node meets), naming the constraint and by how much. A
    pipeline that only waits for nodes to come up or free a slot is accepted."""
    topology = state.full_topology()
    try:
        compiled = compile_fragments(record.spec, topology, record.parallelism)
        if topology.nodes:
            plan_pipeline(
                compiled,
                offline_view(topology),
                priority=record.priority,
                latency_budget=record.latency_budget,
            )
    except (PlanError, PlacementError) as exc:
        raise Invalid("unplaceable", f"pipeline {record.name!r} cannot be placed: {exc}") from None


def cancel(tx: Draft, name: str) -> None:
    record = pipeline(tx.state, name)
    check_transition(record, PipelineState.CANCELED)
    end(tx, name, PipelineState.CANCELED, "canceled by request")


def savepoint(tx: Draft, name: str, savepoint_root: str) -> None:
    """Stop every fragment at a consistent checkpoint and keep a copy of it."""
    record = pipeline(tx.state, name)
    if record.state not in (PipelineState.RUNNING, PipelineState.FAILING, PipelineState.PLANNED):
        raise Conflict(
            "not_running",
            f"pipeline {name!r} is {record.state.value}; only a running pipeline takes a savepoint",
        )
    target = locations.join(savepoint_root, name, f"{record.run_id}-{int(tx.at)}")
    dirs = {
        a.fragment.id: locations.join(target, a.fragment.id) for a in tx.state.assignments_of(name)
    }
    tx.add(r.SavepointStarted, pipeline=name, savepoint=target, fragment_dirs=dirs)


def upgrade(tx: Draft, spec: PipelineSpec, savepoint_root: str, because: str = "") -> UpgradeReport:
    """Start a new version of a running pipeline from the old one's state: check it
    step by step (:func:`spanflow.spec.upgrade.check_upgrade`, for the pipeline and for
    each fragment the old one runs), then take a savepoint; once every fragment has
    stopped at it, the new version starts from it (:func:`finish_upgrade`). A version
    that cannot keep the state is refused with the reason per step, and nothing stops.
    ``because``: why, when the coordinator upgrades on its own (a site joined)."""
    name = spec.name
    record = pipeline(tx.state, name)
    if record.upgrade is not None:
        raise Conflict("upgrade_pending", f"pipeline {name!r} is being upgraded already")
    secrets = spec.inline_secrets()
    if secrets:
        raise Invalid("inline_secret", f"pipeline {name!r} holds secrets in its spec: {secrets}")
    report = check_upgrade(record.spec, spec)
    by_fragment = _fragment_verdicts(tx.state, record, spec)
    refused_here = [s for s in by_fragment if s.verdict == Verdict.REFUSED]
    refused = list(dict.fromkeys(report.refused + refused_here))
    if refused:
        raise Conflict("upgrade_refused", str(UpgradeRefused(name, refused)))
    check_plannable(tx.state, record.model_copy(update={"spec": spec, "fragments": []}))
    savepoint(tx, name, savepoint_root)
    sources = [s for s in by_fragment if s.step not in {t.step for t in report.steps}]
    steps = report.to_json() + UpgradeReport(tuple(sources)).to_json()
    tx.add(r.UpgradeRequested, pipeline=name, spec=spec, steps=steps, because=because)
    return report


def follow_sites(
    tx: Draft, savepoint_root: str, runtime_of: drains.RuntimeOf = lambda _: None
) -> dict[str, str]:
    """Take the sites that joined the topology into the running pipelines that read
    there, and let the sites that left go: each running pipeline whose queries keep
    offsets by source name, and whose plan today has a site more or less, is upgraded
    to its own spec re-planned — a new site's fragment starts empty, the global fragment
    goes on from its savepoint reading one site more (or less), every other fragment
    from its own. A site that left is drained first (:mod:`spanflow.control.drains`):
    the upgrade waits until the global fragment has read all it sent. ``runtime_of``:
    the latest report of a fragment. Returns pipeline → what happened (``site edge-c
    joined: upgrading``, what a drain waits for, or why it is not followed).

    Not followed: a pipeline placed before sources were named (its global query cannot
    take a source in or let one go: resubmit it), and a change whose state cannot be
    carried over (one site becoming two moves the windows into a new global
    fragment)."""
    out: dict[str, str] = {}
    for record in list(tx.state.pipelines.values()):
        if record.state not in FOLLOWED or record.upgrade is not None:
            continue
        behind = fleet.sites_behind(tx.state, record)
        if behind is None:
            continue
        because = _sites_changed(behind.joined, behind.left)
        if not record.named_sources:
            out[record.name] = f"{because}: placed before sources were named; resubmit it"
            continue
        if behind.left:
            view = drains.drains(tx.state, record, behind.left, runtime_of, tx.at)
            for mark in view.marks:
                tx.add(r.SiteDraining, pipeline=record.name, drain=mark)
            if not view.drained:
                waits = "; ".join(f"{s}: {why}" for s, why in view.waiting.items())
                out[record.name] = f"{because}: draining ({waits or 'marked'})"
                continue
            because += " (drained)"
        if not _runs_but_for(record, behind.left, runtime_of):
            out[record.name] = f"{because}: waiting for the pipeline to run"
            continue
        try:
            upgrade(tx, record.spec, savepoint_root, because=because)
        except (Conflict, Invalid) as exc:
            out[record.name] = f"{because}: not followed: {exc}"
        else:
            out[record.name] = f"{because}: upgrading"
    return out


def _runs_but_for(record: PipelineRecord, left: list[str], runtime_of: drains.RuntimeOf) -> bool:
    """Whether every fragment runs, but for the local fragments of sites that left (a
    site's node removed leaves its fragment without one): a savepoint can complete."""
    if record.state == PipelineState.RUNNING:
        return True
    for f in record.fragments:
        if f.site in left:
            continue
        rt = runtime_of(f.id)
        if rt is None or rt.status != "running":
            return False
    return True


FOLLOWED = (PipelineState.RUNNING, PipelineState.FAILING)
"""Pipelines whose sites are followed: a site's node removed leaves its local fragment
without a node (the pipeline failing), and letting that site go is the repair."""


def _sites_changed(joined: list[str], left: list[str]) -> str:
    parts = [f"site {', '.join(joined)} joined"] if joined else []
    parts += [f"site {', '.join(left)} left"] if left else []
    return ", ".join(parts)


def _fragment_verdicts(
    state: ClusterState, record: PipelineRecord, spec: PipelineSpec
) -> list[StepUpgrade]:
    """Each running fragment against the one the new version plans under its id (the
    planner's own steps included: a site's partial aggregate, a bridge, a per-site
    source of a global fragment, which a pipeline with named sources may gain)."""
    try:
        planned = compile_fragments(spec, state.full_topology(), record.parallelism).fragments
    except PlanError as exc:
        raise Invalid("unplaceable", f"pipeline {spec.name!r} cannot be placed: {exc}") from None
    old = {f.id: f for f in record.fragments if not f.replica}
    sinks = {f.id: {s.id for s in f.spec.sinks()} for f in planned}
    out: list[StepUpgrade] = []
    for fragment in planned:
        before = old.get(fragment.id)
        if before is not None:
            named = _named_queries(before.spec) if record.named_sources else set()
            out += check_upgrade(before.spec, fragment.spec, named=named).steps
        out += _moved_queries(old, fragment, sinks)
    return out


def _named_queries(spec: PipelineSpec) -> set[str]:
    """The sinks of a fragment placed with named sources whose queries keep offsets by
    name (the runner names a query's sources only where Spark can)."""
    return {s.id for s in spec.sinks() if can_name_sources(spec, s.id)}


def _moved_queries(
    old: Mapping[str, Fragment], fragment: Fragment, planned: Mapping[str, set[str]]
) -> list[StepUpgrade]:
    """Sinks whose stateful query another fragment of the old version ran and no longer
    runs: its state is in that fragment's checkpoint, which this one does not start
    from. (Each site's local fragment runs a query of the same sink id on a checkpoint
    of its own: a sink this fragment ran before, or another site's fragment keeps
    running, has not moved; a site that leaves takes its own query's state with it.)
    ``planned``: fragment id → its sinks' ids in the new plan."""
    out = []
    before = old.get(fragment.id)
    own = {s.id for s in before.spec.sinks()} if before is not None else set()
    for sink in fragment.spec.sinks():
        if sink.id in own:
            continue  # its own checkpoint holds the query's state
        for was in old.values():
            if was.id == fragment.id or sink.id not in {s.id for s in was.spec.sinks()}:
                continue
            if sink.id in planned.get(was.id, set()):
                continue
            out += [
                StepUpgrade(
                    sink.id,
                    step,
                    Verdict.REFUSED,
                    f"its query would move from fragment {was.id!r} to {fragment.id!r}, "
                    "whose checkpoint does not hold its state",
                )
                for step in stateful_steps(was.spec, sink.id)
            ]
    return out


def finish_upgrade(tx: Draft, name: str) -> None:
    """The old version stopped at its savepoint: the new one replaces it and starts
    from there."""
    record = pipeline(tx.state, name)
    if record.upgrade is None or record.state != PipelineState.STOPPED or not record.savepoint:
        return
    held = [f.id for f in record.fragments]  # the plan, standby replicas included
    tx.add(r.PipelineUpgraded, pipeline=name, savepoint=record.savepoint, fragments=held)


def resume(tx: Draft, name: str, source: str | None, exists: bool) -> None:
    """Start a stopped pipeline from ``source`` (default: its last savepoint);
    ``exists`` says whether that directory is there (the shell looked)."""
    record = pipeline(tx.state, name)
    if record.state != PipelineState.STOPPED:
        raise Conflict(
            "not_stopped",
            f"pipeline {name!r} is {record.state.value}; only a stopped pipeline resumes",
        )
    if source is None or not exists:
        raise Invalid("no_savepoint", f"savepoint {source!r} does not exist")
    tx.add(r.PipelineResumed, pipeline=name, savepoint=source)


def rebaseline(
    tx: Draft,
    name: str,
    step: str | None,
    key: str | None,
    record: Mapping[str, Any] | None = None,
    by: str = "",
) -> r.DetectorRebaselined:
    """Accept a key's current behaviour as normal in a detect_anomalies step (the only
    one, when ``step`` is None). The key is ``key`` (``*``: every key), or the one of
    ``record`` — a detection as a sink wrote it — read from the step's key fields."""
    pipe = pipeline(tx.state, name)
    if pipe.state.terminal:
        raise Conflict("not_running", f"pipeline {name!r} is {pipe.state.value}")
    spec = pipe.spec.expanded()
    detectors = [s for s in spec.steps if isinstance(s, DetectAnomaliesStep)]
    chosen = _detector(name, detectors, step)
    text = _rebaseline_key(spec, chosen, key, record)
    generation = 1 + max(pipe.rebaselines.get(chosen.id, {}).values(), default=0)
    return tx.add(
        r.DetectorRebaselined, pipeline=name, step=chosen.id, key=text, generation=generation, by=by
    )


def _detector(
    name: str, detectors: list[DetectAnomaliesStep], step: str | None
) -> DetectAnomaliesStep:
    ids = [d.id for d in detectors]
    if not detectors:
        raise Invalid("no_detector", f"pipeline {name!r} has no detect_anomalies step")
    if step is None:
        if len(detectors) > 1:
            raise Invalid("which_step", f"pipeline {name!r} has several detectors {ids}: name one")
        return detectors[0]
    for d in detectors:
        if d.id == step:
            return d
    raise NotFound("no_step", f"pipeline {name!r} has no detect_anomalies step {step!r}: {ids}")


def _rebaseline_key(
    spec: PipelineSpec, step: DetectAnomaliesStep, key: str | None, record: Mapping[str, Any] | None
) -> str:
    if (key is None) == (record is None):
        raise Invalid("which_key", "give exactly one of 'key' (or '*': every key) and 'record'")
    if key is not None:
        text = key.strip()
        if not text or len(text) > MAX_KEY_TEXT:
            raise Invalid("bad_key", f"a key is 1 to {MAX_KEY_TEXT} characters")
        return text
    assert record is not None
    fields = spec.facts()[step.inputs[0]].key
    if not fields:
        return EVERY_KEY  # the step keeps one model for the whole stream
    missing = [f for f in fields if f not in record]
    if missing:
        raise Invalid("bad_record", f"the record has no key field {missing} (the key: {fields})")
    values = tuple(record[f] for f in fields)
    return key_text(values if len(values) > 1 else values[0])


def check_transition(record: PipelineRecord, to: PipelineState) -> None:
    if to not in TRANSITIONS[record.state]:
        raise Conflict(
            "bad_transition",
            f"pipeline {record.name!r} is {record.state.value}; cannot move to {to.value}",
        )


def end(tx: Draft, name: str, state: PipelineState, reason: str) -> None:
    tx.add(_ENDINGS[state], pipeline=name, reason=reason)


def set_state(tx: Draft, name: str, state: PipelineState, reason: str) -> None:
    """Move a pipeline along its lifecycle; a move the lifecycle forbids is ignored."""
    record = tx.state.pipelines[name]
    if record.state == state and record.reason == reason:
        return
    if state != record.state and state not in TRANSITIONS[record.state]:
        log.warning("ignoring %s → %s for %s", record.state, state, name)
        return
    tx.add(r.PipelineStateChanged, pipeline=name, state=state, reason=reason)
