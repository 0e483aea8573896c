"""Scheduler room: where fragments run — placing the unplaced, taking fragments off a
node that failed, drained or left, and moving running fragments when a fresh plan is
clearly better (a move goes through a savepoint, so state and exactly-once output
survive it).

Pure decisions over a :class:`~spanflow.control.state.Draft`; ``now`` is the
coordinator's monotonic clock (for how long a node has been settling).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from spanflow.control import pipelines
from spanflow.control import records as r
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed
from spanflow.plan import ClusterView, PlacementError, Placer
from spanflow.plan.fragments import PlanError
from spanflow.plan.planner import Plan, hops_of, place
from spanflow.spec import locations
from spanflow.spec.cluster import Assignment, Fragment, NodeState, PipelineRecord, PipelineState
from spanflow.spec.topology import Site

log = logging.getLogger(__name__)


def cluster_view(state: ClusterState, observed: Observed) -> ClusterView:
    view = ClusterView(
        topology=state.full_topology(),
        nodes=state.nodes,
        cpu_percent={n: hb.cpu_percent for n, hb in observed.heartbeats.items()},
    )
    for a in state.assignments.values():
        view.take(a.fragment, a.node)
    return view


def schedule(
    tx: Draft,
    placer: Placer,
    settings: CoordinatorSettings,
    observed: Observed,
    exclude: Iterable[str] = (),
) -> None:
    """Place every fragment of an active pipeline that has no node (highest priority first)."""
    active = [p for p in tx.state.pipelines.values() if p.state in pipelines.ACTIVE]
    active.sort(key=lambda p: (-p.priority, p.submitted_at))
    for record in active:
        try:
            planned = pipelines.fragments(tx.state, record)
        except PlanError as exc:
            pipelines.end(tx, record.name, PipelineState.FAILED, f"cannot be planned: {exc}")
            continue
        missing = [f for f in planned if f.id not in tx.state.assignments]
        if not missing:
            continue
        needed, standby = split_standby(tx.state, missing)
        view = cluster_view(tx.state, observed)
        try:
            placement = placer.place(record, needed, view, exclude=exclude) if needed else {}
        except PlacementError as exc:
            waiting = (
                PipelineState.CREATED
                if record.state == PipelineState.CREATED
                else PipelineState.FAILING
            )
            pipelines.set_state(tx, record.name, waiting, f"waiting for a node: {exc}")
            continue
        placement.update(place_standby(placer, record, standby, view, exclude))
        made = []
        for fragment in (f for f in missing if f.id in placement):
            epoch = record.epochs.get(fragment.id, 0) + 1
            made.append(
                Assignment(
                    fragment=fragment,
                    node=placement[fragment.id],
                    epoch=epoch,
                    checkpoint_dir=checkpoint_dir(
                        tx.state, settings, placement[fragment.id], fragment
                    ),
                    restore_from=restored_from(record, fragment),
                    reason="placed" if epoch == 1 else "re-placed",
                    batch_plan=batch_plan(record, fragment),
                    peer_checkpoints=peer_checkpoints(
                        tx.state, settings, planned, fragment, placement
                    ),
                    priority=record.priority,
                    latency_budget=record.latency_budget,
                )
            )
        if made:
            tx.add(r.FragmentsAssigned, pipeline=record.name, plan=tuple(planned), assignments=made)


def split_standby(
    state: ClusterState, missing: list[Fragment]
) -> tuple[list[Fragment], list[Fragment]]:
    """The unplaced fragments the pipeline cannot run without (one replica of each
    fragment none of whose replicas is placed), and its hot standby replicas, which
    wait for a second node without holding the pipeline up."""
    running = {a.fragment.base_id for a in state.assignments.values()}
    needed: list[Fragment] = []
    standby: list[Fragment] = []
    for fragment in missing:
        if fragment.base_id in running:
            standby.append(fragment)
        else:
            running.add(fragment.base_id)
            needed.append(fragment)
    return needed, standby


def place_standby(
    placer: Placer,
    record: PipelineRecord,
    standby: list[Fragment],
    view: ClusterView,
    exclude: Iterable[str],
) -> dict[str, str]:
    """Hot standby replicas, each on a node none of its other replicas holds, where one
    fits; the others stay unplaced (the reconciler names them) and are tried again on
    the scheduler's next pass."""
    out: dict[str, str] = {}
    for fragment in standby:
        try:
            out.update(placer.place(record, [fragment], view, exclude=exclude))
        except PlacementError as exc:
            log.debug("standby %s not placed: %s", fragment.id, exc)
    return out


def peer_checkpoints(
    state: ClusterState,
    settings: CoordinatorSettings,
    planned: list[Fragment],
    fragment: Fragment,
    placement: dict[str, str],
) -> tuple[str, ...]:
    """Where the fragment's other replicas checkpoint: an assigned one's own, else
    where it will (under the state root of the node it goes to, or of this one's)."""
    out = []
    for other in planned:
        if other.base_id != fragment.base_id or other.id == fragment.id:
            continue
        a = state.assignments.get(other.id)
        if a is not None:
            out.append(a.checkpoint_dir)
        else:
            node = placement.get(other.id, placement[fragment.id])
            out.append(checkpoint_dir(state, settings, node, other))
    return tuple(out)


def restored_from(record: PipelineRecord, fragment: Fragment) -> str | None:
    """The savepoint directory ``fragment`` starts from: its own under the pipeline's
    ``restore_from``, unless that savepoint does not hold it (a fragment an upgrade
    added starts empty)."""
    if not record.restore_from:
        return None
    held = record.restore_fragments
    if held is not None and fragment.id not in held:
        return None
    return locations.join(record.restore_from, fragment.id)


def batch_plan(record: PipelineRecord, fragment: Fragment) -> str | None:
    """What a fragment's replicas agree their micro-batches under: the pipeline's run
    and the planned fragment (a resubmitted pipeline plans afresh); None without
    standby, where each fragment plans its batches alone."""
    if not record.spec.standby:
        return None
    return f"{record.run_id}.{fragment.base_id}"


def move_fragments_off(
    tx: Draft,
    node: str,
    *,
    reason: str,
    placer: Placer,
    settings: CoordinatorSettings,
    observed: Observed,
    failed: bool = False,
) -> None:
    """Unassign a node's fragments and place them on other nodes.

    A silent node of a site with its own NATS server keeps its local fragments when no
    other node of the site is live: it is most likely cut off, not dead (its data is on
    the site's server, out of everyone else's reach), and it keeps processing and
    buffering; it picks up where it is when the uplink returns."""
    moving = tx.state.assignments_on(node)
    if failed:
        moving = [a for a in moving if not stranded_at_own_site(tx.state, a, node)]
    if not moving:
        return
    tx.add(
        r.FragmentsUnassigned,
        node=node,
        fragments=tuple(a.fragment.id for a in moving),
        reason=reason,
    )
    stalled = {a.fragment.pipeline for a in moving if not served_elsewhere(tx.state, a)}
    for name in sorted(stalled):
        record = tx.state.pipelines.get(name)
        if record is not None and record.state in pipelines.ACTIVE:
            pipelines.set_state(tx, name, PipelineState.FAILING, reason)
    saving = [a for a in moving if a.action == "savepoint" and a.move_to is None]
    finish_savepoints_elsewhere(tx, saving, node, placer, observed)
    schedule(tx, placer, settings, observed, exclude=[node])


def finish_savepoints_elsewhere(
    tx: Draft, saving: list[Assignment], node: str, placer: Placer, observed: Observed
) -> None:
    """Fragments of a stopping pipeline whose node failed before it saved them: another
    node copies each one's last checkpoint (consistent: it holds committed batches
    only) to its savepoint directory. Without this, the pipeline would stop with their
    savepoints missing, and could neither resume nor upgrade from it."""
    by_pipeline: dict[str, list[Assignment]] = {}
    for a in saving:
        by_pipeline.setdefault(a.fragment.pipeline, []).append(a)
    view = cluster_view(tx.state, observed)
    for name, assignments in sorted(by_pipeline.items()):
        record = tx.state.pipelines.get(name)
        if record is None or record.state != PipelineState.STOPPING:
            continue
        fragments = [a.fragment for a in assignments]
        try:
            placement = placer.place(record, fragments, view, exclude=[node])
        except PlacementError as exc:
            log.warning("%s: savepoint of %s must wait for a node: %s", name, node, exc)
            continue
        made = [
            a.model_copy(
                update={
                    "node": placement[a.fragment.id],
                    "epoch": record.epochs.get(a.fragment.id, a.epoch) + 1,
                    "reason": f"saving the checkpoint node {node} left (it failed)",
                }
            )
            for a in assignments
            if a.fragment.id in placement
        ]
        if made:
            tx.add(
                r.FragmentsAssigned, pipeline=name, plan=tuple(record.fragments), assignments=made
            )


def served_elsewhere(state: ClusterState, a: Assignment) -> bool:
    """Whether another replica of ``a``'s fragment runs on a live node (hot standby):
    its output keeps flowing while ``a`` is placed again."""
    return any(
        other.fragment.base_id == a.fragment.base_id
        and other.fragment.id != a.fragment.id
        and (node := state.nodes.get(other.node)) is not None
        and node.state == NodeState.ALIVE
        for other in state.assignments.values()
    )


def stranded_at_own_site(state: ClusterState, a: Assignment, node: str) -> bool:
    site_name = a.fragment.site
    if a.fragment.kind != "local" or site_name is None:
        return False
    site = state.topology.site(site_name)
    if site is None or not site.nats_url:
        return False
    return not any(
        n.state == NodeState.ALIVE and n.spec.site == site_name and n.name != node
        for n in state.nodes.values()
    )


# -- re-planning ---------------------------------------------------------------------------
def cost(state: ClusterState, fragment: Fragment, node: str) -> float | None:
    """What a placement costs in the planner's terms: a local fragment's distance from
    its own site, a global fragment's worst latency to its input sites."""
    record = state.nodes.get(node)
    if record is None:
        return None
    topology = state.topology
    site = record.spec.site
    if fragment.kind == "local" and fragment.site is not None:
        return topology.latency(fragment.site, site)
    values = [topology.latency(site, s) for s in fragment.input_sites]
    if any(v is None for v in values):
        return None
    return max((v for v in values if v is not None), default=0.0)


def settling(observed: Observed, settings: CoordinatorSettings, now: float) -> list[str]:
    """Nodes that joined or recovered less than ``settle_seconds`` ago."""
    limit = now - settings.settle_seconds
    return [n for n in observed.unsettled if observed.alive_since.get(n, 0) > limit]


def rebalance_settled(
    tx: Draft, observed: Observed, settings: CoordinatorSettings, now: float
) -> list[str]:
    """Re-plan once nodes that joined or recovered have stayed alive long enough;
    returns the nodes that settled (the shell forgets they were settling)."""
    still = set(settling(observed, settings, now))
    settled = sorted(observed.unsettled - still)
    live = [n for n in settled if n in tx.state.nodes]
    if live:
        rebalance(tx, observed, settings, now, f"node {', '.join(live)} joined")
    return settled


def rebalance(
    tx: Draft, observed: Observed, settings: CoordinatorSettings, now: float, reason: str
) -> None:
    """After a topology change, re-plan running fragments one at a time and move the
    ones whose new place is better by the margin."""
    view = cluster_view(tx.state, observed)
    margin = settings.replan_margin
    exclude_settling = settling(observed, settings, now)
    for record in sorted(tx.state.pipelines.values(), key=lambda p: -p.priority):
        if record.state != PipelineState.RUNNING or not record.fragments:
            continue
        for a in tx.state.assignments_of(record.name):
            if a.action != "run" or a.move_to:
                continue
            current = cost(tx.state, a.fragment, a.node)
            view.release(a.fragment, a.node)
            try:
                plan = place_again(
                    tx.state, a, view, exclude=[n for n in exclude_settling if n != a.node]
                )
            except PlacementError:
                view.take(a.fragment, a.node)
                continue
            target = plan.placement[a.fragment.id]
            better = cost(tx.state, a.fragment, target)
            gain = (current if current is not None else float("inf")) - (better or 0.0)
            if target == a.node or better is None or gain <= max(0.001, margin * (current or 0)):
                view.release(a.fragment, target)
                view.take(a.fragment, a.node)
                continue
            start_move(tx, a, target, f"{reason}: {plan.decisions[0].why}", settings)


def place_again(
    state: ClusterState, a: Assignment, view: ClusterView, *, exclude: Iterable[str]
) -> Plan:
    """A fresh placement of a running fragment under its pipeline's constraints
    (priority, latency budget, trigger, path length); :class:`PlacementError` says
    which failed."""
    record = state.pipelines[a.fragment.pipeline]
    return place(
        [a.fragment],
        view,
        priority=record.priority,
        latency_budget=record.latency_budget,
        trigger=record.spec.trigger,
        realtime=record.spec.all_realtime(),
        hops=hops_of(record.fragments),
        exclude=exclude,
    )


def start_move(
    tx: Draft, a: Assignment, target: str, reason: str, settings: CoordinatorSettings
) -> None:
    savepoint = move_savepoint(tx.state, settings, a, target)
    tx.add(
        r.MoveStarted,
        fragment=a.fragment.id,
        node=a.node,
        to=target,
        savepoint_dir=savepoint,
        reason=reason,
    )
    log.info("moving %s from %s to %s: %s", a.fragment.id, a.node, target, reason)


def site_of(state: ClusterState, node: str) -> Site | None:
    record = state.nodes.get(node)
    return state.topology.site(record.spec.site) if record is not None else None


def checkpoint_dir(
    state: ClusterState, settings: CoordinatorSettings, node: str, fragment: Fragment
) -> str:
    """A fragment's checkpoint when it runs on ``node``: under its site's state root
    (the site's ``state:``, else the coordinator's ``--state-dir``)."""
    run_id = state.pipelines[fragment.pipeline].run_id
    root = settings.state_root(site_of(state, node))
    return locations.join(root, "checkpoints", fragment.pipeline, run_id, fragment.id)


def move_savepoint(
    state: ClusterState, settings: CoordinatorSettings, a: Assignment, target: str
) -> str:
    """Where a moving fragment's savepoint goes: under the *target's* state root (its
    site's ``state:``, else ``--state-dir``), and for a ``jetstream://`` root in the store
    of the target's JetStream domain (its site's own server, else the hub's), so the new
    node reads what the old one wrote even when the move crosses sites."""
    site = site_of(state, target)
    path = locations.join(
        settings.state_root(site),
        "savepoints",
        "moves",
        a.fragment.pipeline,
        f"{a.fragment.id}-e{a.epoch}",
    )
    domain = site.name if site is not None and site.nats_url else settings.hub_domain
    return locations.in_domain(path, domain)


def finish_move(tx: Draft, a: Assignment, settings: CoordinatorSettings) -> None:
    """The fragment stopped at a savepoint on its old node: start it on the new one."""
    assert a.move_to is not None
    record = tx.state.pipelines.get(a.fragment.pipeline)
    if record is None:
        return
    epoch = max(record.epochs.get(a.fragment.id, 0), a.epoch) + 1
    moved_to = checkpoint_dir(tx.state, settings, a.move_to, a.fragment)
    tx.add(
        r.MoveFinished,
        fragment=a.fragment.id,
        node=a.node,
        to=a.move_to,
        fragment_epoch=epoch,
        checkpoint_dir=moved_to if moved_to != a.checkpoint_dir else None,
    )
