"""Topology manager room: which nodes are alive, from their heartbeats.

A node silent for ``failure_after`` heartbeat periods is failed and its fragments are
placed elsewhere (resuming from their checkpoints); a failed node heard again recovers.
``now`` is the coordinator's monotonic clock.
"""

from __future__ import annotations

import logging

from spanflow.control import records as r
from spanflow.control import scheduler
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed
from spanflow.plan import Placer
from spanflow.spec.cluster import Heartbeat, NodeState

log = logging.getLogger(__name__)

WATCHED = (NodeState.ALIVE, NodeState.DRAINING)


def grace(state: ClusterState, observed: Observed, now: float, *, reset: bool = False) -> None:
    """Give live nodes a full period to be heard: those not heard yet (a coordinator
    that just took office; a standby has been hearing them all along), or all of them
    (``reset``: the coordinator itself was cut off from NATS)."""
    for name, record in state.nodes.items():
        if record.state in WATCHED:
            if reset:
                observed.last_seen[name] = now
            else:
                observed.last_seen.setdefault(name, now)


def heard(state: ClusterState, observed: Observed, hb: Heartbeat, now: float) -> bool | None:
    """Take a heartbeat in. None: not from the node's current agent (ignored); True: it
    calls for a decision (the node had failed, or a fragment's status changed)."""
    record = state.nodes.get(hb.node)
    if record is None or (record.agent_id and hb.agent_id != record.agent_id):
        return None
    observed.last_seen[hb.node] = now
    observed.heartbeats[hb.node] = hb
    changed = False
    for frag_id, rt in hb.fragments.items():
        a = state.assignments.get(frag_id)
        if a is not None and a.node == hb.node and a.epoch == rt.epoch:
            old = observed.runtime.get(frag_id)
            changed |= old is None or (old.status, old.epoch) != (rt.status, rt.epoch)
            observed.runtime[frag_id] = rt
    return changed or record.state == NodeState.FAILED


def recover(tx: Draft, node: str) -> bool:
    """A failed node was heard: it is alive again (True when that is news)."""
    record = tx.state.nodes.get(node)
    if record is None or record.state != NodeState.FAILED:
        return False
    tx.add(r.NodeRecovered, node=node, reason="heard again")
    return True


def silent(
    state: ClusterState, observed: Observed, settings: CoordinatorSettings, now: float
) -> list[tuple[str, float]]:
    """Live nodes not heard for longer than ``failure_seconds``: (name, seconds)."""
    limit = settings.failure_seconds
    out = []
    for name, record in sorted(state.nodes.items()):
        if record.state not in WATCHED:
            continue
        quiet = now - observed.last_seen.get(name, now)
        if quiet > limit:
            out.append((name, quiet))
    return out


def fail(
    tx: Draft,
    node: str,
    quiet: float,
    *,
    placer: Placer,
    settings: CoordinatorSettings,
    observed: Observed,
) -> None:
    tx.add(r.NodeFailed, node=node, reason=f"no heartbeat for {quiet:.1f} s")
    log.warning("node %s missed heartbeats for %.1f s: failed", node, quiet)
    scheduler.move_fragments_off(
        tx,
        node,
        reason=f"node {node} failed",
        placer=placer,
        settings=settings,
        observed=observed,
        failed=True,
    )
