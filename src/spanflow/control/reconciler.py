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
from spanflow.spec.cluster import Assignment, NodeState, PipelineState

_WATCHED = (PipelineState.PLANNED, PipelineState.RUNNING, PipelineState.FAILING)


def refresh_states(tx: Draft, observed: Observed) -> None:
    """RUNNING when every fragment runs; FAILING while any is failing or unreachable."""
    for record in list(tx.state.pipelines.values()):
        if record.state not in _WATCHED:
            continue
        planned = pipelines.fragments(tx.state, record)
        statuses: list[str | None] = []
        unreachable = []
        for f in planned:
            a = tx.state.assignments.get(f.id)
            node = tx.state.nodes.get(a.node) if a else None
            if a is not None and node is not None and node.state == NodeState.FAILED:
                unreachable.append(f"{f.id} on {a.node}")
            rt = observed.current(a) if a is not None else None
            statuses.append(None if a is None else (rt.status if rt else "starting"))
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
            pipelines.set_state(tx, record.name, PipelineState.RUNNING, "all fragments running")
        elif any(s == "failing" for s in statuses):
            errors = [rt.error for f in planned if (rt := observed.runtime.get(f.id))]
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
