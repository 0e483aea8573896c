"""Reconciler room: what the nodes report against what the log says should run.

A pipeline is RUNNING when every fragment of the current epoch runs, FAILING while one
fails or its node is unreachable, FINISHED when every query finished; a fragment that
reports it stopped at its move's savepoint starts on its new node; a pipeline whose
fragments all stopped at their savepoints is STOPPED.
"""

from __future__ import annotations

from spanflow.control import pipelines, scheduler
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed
from spanflow.protocol.messages import Activity
from spanflow.spec.cluster import Assignment, Fragment, NodeState, PipelineState

_WATCHED = (PipelineState.PLANNED, PipelineState.RUNNING, PipelineState.FAILING)
UNREACHABLE = "unreachable"


def replica_status(state: ClusterState, observed: Observed, f: Fragment) -> str | None:
    """One replica's status: None unplaced, 'unreachable' on a failed node, else what
    its node reports ('starting' until it does)."""
    a = state.assignments.get(f.id)
    if a is None:
        return None
    node = state.nodes.get(a.node)
    if node is not None and node.state == NodeState.FAILED:
        return UNREACHABLE
    rt = observed.current(a)
    return rt.status if rt else "starting"


def fragment_status(statuses: list[str | None]) -> str | None:
    """A planned fragment's status from its replicas' (one without hot standby): it
    runs while any replica runs — the others only stand by."""
    placed = [s for s in statuses if s is not None]
    if not placed:
        return None
    for status in ("running", "starting", "failing"):
        if status in placed:
            return status
    return placed[0] if len(set(placed)) == 1 else "starting"


def refresh_states(tx: Draft, observed: Observed) -> None:
    """RUNNING when every fragment runs (one replica of each, with hot standby);
    FAILING while any is failing or unreachable."""
    for record in list(tx.state.pipelines.values()):
        if record.state not in _WATCHED:
            continue
        groups: dict[str, list[Fragment]] = {}
        for f in pipelines.fragments(tx.state, record):
            groups.setdefault(f.base_id, []).append(f)
        statuses: list[str | None] = []
        unreachable = []
        no_standby = []
        for base, replicas in groups.items():
            each = [replica_status(tx.state, observed, f) for f in replicas]
            status = fragment_status(each)
            statuses.append(status)
            if status == UNREACHABLE:
                nodes = [a.node for f in replicas if (a := tx.state.assignments.get(f.id))]
                unreachable.append(f"{base} on {', '.join(nodes)}")
            elif len(replicas) > 1 and each.count("running") < len(replicas):
                no_standby.append(base)
        if any(s is None for s in statuses):
            continue  # the scheduler says why
        if unreachable:
            pipelines.set_state(
                tx,
                record.name,
                PipelineState.FAILING,
                f"unreachable: {', '.join(unreachable)} (cut off? a site with its own "
                "server keeps processing and catches up when it returns)",
            )
        elif all(s == "running" for s in statuses):
            reason = "all fragments running"
            if no_standby:
                reason += f" (standby not running yet: {', '.join(no_standby)})"
            pipelines.set_state(tx, record.name, PipelineState.RUNNING, reason)
        elif any(s == "failing" for s in statuses):
            errors = [
                rt.error for fs in groups.values() for f in fs if (rt := observed.runtime.get(f.id))
            ]
            pipelines.set_state(
                tx,
                record.name,
                PipelineState.FAILING,
                "; ".join(e for e in errors if e) or "a fragment is failing",
            )
        elif all(s == "finished" for s in statuses):
            pipelines.end(tx, record.name, PipelineState.FINISHED, "every query finished")


def current_assignment(state: ClusterState, act: Activity) -> Assignment | None:
    """The assignment an activity report is about, if it is still the current one."""
    a = state.assignments.get(act.runtime.fragment_id)
    if a is None or a.node != act.node or a.epoch != act.runtime.epoch:
        return None
    return a


def on_activity(
    tx: Draft, observed: Observed, act: Activity, settings: CoordinatorSettings
) -> None:
    """Decide on what an agent reported (the runtime is already in ``observed``)."""
    a = current_assignment(tx.state, act)
    record = tx.state.pipelines.get(a.fragment.pipeline) if a else None
    if a is None or record is None:
        return
    rt = act.runtime
    if act.event == "savepointed" and a.move_to:
        if act.savepoint_dir == a.savepoint_dir:
            scheduler.finish_move(tx, a, settings)
    elif act.event == "failed":
        pipelines.end(
            tx,
            record.name,
            PipelineState.FAILED,
            f"fragment {rt.fragment_id} on {act.node}: {rt.error}",
        )
    elif act.event == "savepointed" and record.state == PipelineState.STOPPING:
        stop_if_savepointed(tx, observed, record.name)
    else:
        refresh_states(tx, observed)


def savepoint_complete(state: ClusterState, observed: Observed, pipeline: str) -> bool:
    """Every fragment of the pipeline reported it stopped (at its current epoch)."""
    return all(
        (rt := observed.current(a)) is not None and rt.status == "stopped"
        for a in state.assignments_of(pipeline)
    )


def stop_if_savepointed(tx: Draft, observed: Observed, pipeline: str) -> None:
    record = tx.state.pipelines[pipeline]
    if record.state == PipelineState.STOPPING and savepoint_complete(tx.state, observed, pipeline):
        pipelines.end(tx, pipeline, PipelineState.STOPPED, f"savepoint {record.savepoint}")
        pipelines.finish_upgrade(tx, pipeline)


def catch_up_savepoints(
    tx: Draft, observed: Observed, reports: list[Activity], settings: CoordinatorSettings
) -> None:
    """Savepoints that completed while no coordinator was listening: ``reports`` are
    the last 'savepointed' activity of each assignment taking one, from the log."""
    for act in reports:
        a = current_assignment(tx.state, act)
        if a is None or a.action != "savepoint" or act.savepoint_dir != a.savepoint_dir:
            continue
        observed.runtime[a.fragment.id] = act.runtime
        if a.move_to:
            scheduler.finish_move(tx, a, settings)
    for record in list(tx.state.pipelines.values()):
        if record.state == PipelineState.STOPPING:
            stop_if_savepointed(tx, observed, record.name)
