"""Rebalancer room: moves asked for by overloaded nodes (peer-to-peer shedding).

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

from spanflow.control import registry, scheduler
from spanflow.control.errors import Conflict, Invalid, NotFound
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import Draft, Observed
from spanflow.plan import PlacementError
from spanflow.spec.cluster import Assignment, NodeState, PipelineState, ShedRequest


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
    view.used_slots[a.node] = view.used_slots.get(a.node, 1) - 1
    try:
        scheduler.place_again(tx.state, a, view, exclude=[n for n in tx.state.nodes if n != target])
    except PlacementError as exc:
        raise Conflict("target_unfit", f"{target} cannot take {a.fragment.id}: {exc}") from None
