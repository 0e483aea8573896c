"""Rebalancer room: moves asked for by overloaded nodes (peer-to-peer shedding), and
the central rebalancer that corrects what shedding could not.

A node whose load stays over its threshold picks one of its fragments and the
least-loaded peer it knows of from gossip (``runtime/shedding``) and asks the
coordinator to move it there. The node knows loads; the coordinator knows what the
node does not — capabilities, the pipeline's latency budget over the topology's
links, what else is moving — and has the last word. An accepted request is an
ordinary savepoint move (``move-start`` → the fragment stops at a committed batch →
``move-done`` → it starts on the peer from that savepoint at a new epoch, the old
owner fenced), so state and exactly-once output survive it.

Pure: ``(state, request, observed, now) → records`` or a :class:`ControlError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from spanflow.control import registry, scheduler
from spanflow.control.errors import Conflict, Invalid, NotFound
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed
from spanflow.plan import PlacementError
from spanflow.protocol.messages import ShedRequest
from spanflow.spec.cluster import Assignment, NodeState, PipelineState


def shed(
    tx: Draft,
    node: str,
    request: ShedRequest,
    observed: Observed,
    settings: CoordinatorSettings,
) -> Assignment:
    """Check the request and start the move; returns the assignment being moved."""
    a = _movable(tx, node, request.fragment)
    target = tx.state.nodes.get(request.to)
    if target is None:
        raise NotFound("unknown_node", f"no node {request.to!r}")
    if request.to == node:
        raise Invalid("same_node", f"{request.fragment} already runs on {node}")
    if target.state != NodeState.ALIVE:
        raise Conflict("target_not_alive", f"{request.to} is {target.state.value}")
    if registry.partition_of(tx.state, node) != registry.partition_of(tx.state, request.to):
        raise Invalid(
            "other_partition",
            f"{request.to} is not in {node}'s partition "
            f"{registry.partition_of(tx.state, node)!r}: shedding stays within one",
        )
    beat = observed.heartbeats.get(request.to)
    if beat is None or not beat.ready or beat.agent_id != target.agent_id:
        raise Conflict("target_not_ready", f"{request.to} has no Spark session running yet")
    _check_fit(tx, a, request.to, observed)
    why = request.reason or "overloaded"
    scheduler.start_move(tx, a, request.to, f"shed by {node} ({why})", settings)
    return a


def _movable(tx: Draft, node: str, fragment: str) -> Assignment:
    if node not in tx.state.nodes:
        raise NotFound("unknown_node", f"no node {node!r}")
    a = tx.state.assignments.get(fragment)
    if a is None or a.node != node:
        raise Conflict("not_on_node", f"{fragment} is not assigned to {node}")
    if a.action != "run" or a.move_to:
        raise Conflict("moving", f"{fragment} is already moving to {a.move_to}")
    record = tx.state.pipelines.get(a.fragment.pipeline)
    if record is None or record.state != PipelineState.RUNNING:
        state = record.state.value if record else "gone"
        raise Conflict("not_running", f"pipeline {a.fragment.pipeline} is {state}")
    return a


def _check_fit(tx: Draft, a: Assignment, target: str, observed: Observed) -> None:
    """The planner's own checks, with the target as the only candidate: capabilities,
    a free slot, and the latency budget over the target's links."""
    view = scheduler.cluster_view(tx.state, observed)
    view.release(a.fragment, a.node)
    try:
        scheduler.place_again(tx.state, a, view, exclude=[n for n in tx.state.nodes if n != target])
    except PlacementError as exc:
        raise Conflict("target_unfit", f"{target} cannot take {a.fragment.id}: {exc}") from None


# -- the central rebalancer ------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    assignment: Assignment
    to: str
    why: str


def rebalance(
    tx: Draft, observed: Observed, settings: CoordinatorSettings, now: float
) -> list[Move]:
    """One pass over every partition (at most one move each, so the next pass sees
    its effect): a node overloaded for longer than ``overload_sustain`` — which its
    own shedding did not fix — gives its lowest-priority fragment to the least-loaded
    peer with room; a fragment over its pipeline's latency budget gets room from a
    lower-priority fragment on its node. A pass that moves nothing for load re-plans
    for latency (a fragment whose fresh placement beats its current one by
    ``replan_margin``, e.g. a closer node that had no free slot when it was placed).
    Moves go through a savepoint."""
    moves = []
    for nodes in _partitions(tx.state, observed).values():
        move = _relieve_overload(tx, observed, settings, now, nodes) or _make_room(
            tx, observed, settings, nodes
        )
        if move is not None:
            scheduler.start_move(tx, move.assignment, move.to, f"rebalanced: {move.why}", settings)
            moves.append(move)
    if not moves:
        scheduler.rebalance(tx, observed, settings, now, "periodic re-plan")
    return moves


def _partitions(state: ClusterState, observed: Observed) -> dict[str, dict[str, float]]:
    """Partition → {node: load} of alive, ready nodes heard from their current agent."""
    out: dict[str, dict[str, float]] = {}
    for name, record in state.nodes.items():
        hb = observed.heartbeats.get(name)
        if (
            record.state != NodeState.ALIVE
            or hb is None
            or hb.agent_id != record.agent_id
            or not hb.ready
            or hb.load is None
        ):
            continue
        out.setdefault(registry.partition_of(state, name), {})[name] = hb.load
    return out


def _movable_here(tx: Draft, node: str, settings: CoordinatorSettings) -> list[Assignment]:
    """Fragments on ``node`` the rebalancer may move: running, not moving, not moved
    within ``move_cooldown``."""
    out = []
    for a in tx.state.assignments_on(node):
        record = tx.state.pipelines.get(a.fragment.pipeline)
        recent = (
            tx.at - tx.state.moved_at.get(a.fragment.id, float("-inf")) < settings.move_cooldown
        )
        running = record is not None and record.state == PipelineState.RUNNING
        if a.action == "run" and not a.move_to and not recent and running:
            out.append(a)
    return out


def _shares(tx: Draft, observed: Observed, node: str, load: float) -> dict[str, float]:
    """What each fragment on ``node`` would add to another node's load: its part of
    the node's capacity (by last batch time), as the agents' shedding policy counts it."""
    load = min(load, 1.0)
    here = tx.state.assignments_on(node)
    times = {}
    for a in here:
        rt = observed.current(a)
        times[a.fragment.id] = rt.last_batch_ms if rt is not None else 0
    total = sum(times.values())
    if total <= 0:
        return {fid: load / max(1, len(here)) for fid in times}
    return {fid: load * t / total for fid, t in times.items()}


def _target(
    tx: Draft,
    observed: Observed,
    settings: CoordinatorSettings,
    a: Assignment,
    share: float,
    nodes: dict[str, float],
) -> str | None:
    """The least-loaded other node of the partition that stays under ``underload``
    with ``a`` and passes the planner's checks."""
    for name, load in sorted(nodes.items(), key=lambda kv: (kv[1], kv[0])):
        if name == a.node:
            continue
        if load + share >= settings.underload:
            return None
        try:
            _check_fit(tx, a, name, observed)
        except Conflict:
            continue
        return name
    return None


def _relieve_overload(
    tx: Draft,
    observed: Observed,
    settings: CoordinatorSettings,
    now: float,
    nodes: dict[str, float],
) -> Move | None:
    for node, load in sorted(nodes.items(), key=lambda kv: -kv[1]):
        since = observed.overloaded_since.get(node)
        if since is None or now - since < settings.overload_sustain:
            continue
        shares = _shares(tx, observed, node, load)
        for a in sorted(
            _movable_here(tx, node, settings),
            key=lambda a: (a.priority, -shares.get(a.fragment.id, 0.0), a.fragment.id),
        ):
            share = shares.get(a.fragment.id, 0.0)
            target = _target(tx, observed, settings, a, share, nodes)
            if target is not None:
                return Move(
                    a,
                    target,
                    f"{node} at load {load:.2f} above {settings.overload:.2f} for "
                    f"{now - since:.0f} s; {target} at {nodes[target]:.2f}",
                )
    return None


def _make_room(
    tx: Draft, observed: Observed, settings: CoordinatorSettings, nodes: dict[str, float]
) -> Move | None:
    """A higher-priority fragment over its latency budget displaces lower-priority work
    from its node."""
    for node, load in sorted(nodes.items(), key=lambda kv: -kv[1]):
        shares = _shares(tx, observed, node, load)
        for late in tx.state.assignments_on(node):
            estimate = _latency_estimate(observed, late)
            budget = late.latency_budget
            if budget is None or estimate is None or estimate <= budget:
                continue
            lower = [a for a in _movable_here(tx, node, settings) if a.priority < late.priority]
            for a in sorted(lower, key=lambda a: (a.priority, -shares.get(a.fragment.id, 0.0))):
                target = _target(tx, observed, settings, a, shares.get(a.fragment.id, 0.0), nodes)
                if target is not None:
                    return Move(
                        a,
                        target,
                        f"{late.fragment.id} (priority {late.priority}) over its latency "
                        f"budget ({estimate:.2f} s > {budget:.2f} s) on {node}; "
                        f"{a.fragment.id} (priority {a.priority}) makes room",
                    )
    return None


def _latency_estimate(observed: Observed, a: Assignment) -> float | None:
    """What a fragment's output lags its input by, from its last progress report: up to
    a trigger interval of waiting, its batch time, and its backlog in seconds."""
    rt = observed.current(a)
    if rt is None or rt.status != "running" or rt.batches == 0:
        return None
    drain = rt.processed_rows_per_s + rt.realtime_rows_per_s
    backlog = rt.lag / drain if drain > 0 else 0.0
    return a.fragment.spec.trigger + rt.last_batch_ms / 1000 + backlog
