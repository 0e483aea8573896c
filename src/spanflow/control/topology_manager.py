"""Topology manager room: which nodes are alive, from their heartbeats and their
partition's gossip.

Two sources, fused:

* **Heartbeats** to the coordinator: a node silent for ``failure_after`` periods is
  failed — unless its partition's membership still hears it (a peer that heartbeats
  reports it alive and heard from within the same window): then only its path to
  the coordinator is broken, and failing it would move work off a working node.
* **Gossip verdicts** (SWIM, ``runtime/membership``), carried in every heartbeat
  (``peers``): a node its partition declares dead or left is failed as soon as it has
  also missed a heartbeat and a half — without waiting for ``failure_after`` periods —
  unless the coordinator heard the node itself *after* the verdict (it refuted it, or
  restarted). Both sources must agree: a CPU-starved agent its peers briefly lose
  still heartbeats, and is not failed.

A failed node heard again recovers. Failing moves its fragments elsewhere (resuming
from their checkpoints). ``now`` is the coordinator's monotonic clock.
"""

from __future__ import annotations

import logging

from spanflow.control import records as r
from spanflow.control import scheduler
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed
from spanflow.plan import Placer
from spanflow.protocol.messages import Heartbeat, PeerView
from spanflow.spec.cluster import NodeState

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


def note_load(observed: Observed, hb: Heartbeat, now: float, overload: float) -> None:
    """Track since when a node has been overloaded without a break."""
    if hb.load is not None and hb.load > overload:
        observed.overloaded_since.setdefault(hb.node, now)
    else:
        observed.overloaded_since.pop(hb.node, None)


def heard(
    state: ClusterState, observed: Observed, hb: Heartbeat, now: float, overload: float = 0.9
) -> bool | None:
    """Take a heartbeat in. None: not from the node's current agent (ignored); True: it
    calls for a decision (the node had failed, or a fragment's status changed)."""
    record = state.nodes.get(hb.node)
    if record is None or (record.agent_id and hb.agent_id != record.agent_id):
        return None
    observed.last_seen[hb.node] = now
    observed.heartbeats[hb.node] = hb
    note_load(observed, hb, now, overload)
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
    """Live nodes not heard for longer than ``failure_seconds`` and not heard by their
    partition either: (name, seconds)."""
    limit = settings.failure_seconds
    out = []
    for name, record in sorted(state.nodes.items()):
        if record.state not in WATCHED:
            continue
        quiet = now - observed.last_seen.get(name, now)
        if quiet > limit and not _vouched_for(state, observed, name, settings, now):
            out.append((name, quiet))
    return out


def _vouched_for(
    state: ClusterState, observed: Observed, name: str, settings: CoordinatorSettings, now: float
) -> bool:
    """A silent node is kept alive by peers that hear it only while no other peer's
    latest report doubts it (suspect, dead or left): one lying node — a stolen agent
    host seals its own heartbeats genuinely — cannot keep a dead peer alive against
    the rest of its partition."""
    if not heard_by_peers(state, observed, name, settings, now):
        return False
    reports = _peer_reports(state, observed, name, settings, now)
    return not any(view.state in ("suspect", "dead", "left") for _, _, view in reports)


def failures(
    state: ClusterState, observed: Observed, settings: CoordinatorSettings, now: float
) -> list[tuple[str, str]]:
    """Nodes to fail now, each once, with the reason: silent ones, then those their
    partition declares dead."""
    found = {
        name: f"no heartbeat for {quiet:.1f} s"
        for name, quiet in silent(state, observed, settings, now)
    }
    for name, reason in declared_dead(state, observed, settings, now):
        found.setdefault(name, reason)
    return sorted(found.items())


def _peer_reports(
    state: ClusterState, observed: Observed, name: str, settings: CoordinatorSettings, now: float
) -> list[tuple[str, float, PeerView]]:
    """What the other live nodes' latest heartbeats (each heard within the failure
    window, from the current agent) say about ``name``: (reporter, heard at, view)."""
    out = []
    for reporter, hb in observed.heartbeats.items():
        record = state.nodes.get(reporter)
        seen = observed.last_seen.get(reporter)
        view = hb.peers.get(name)
        if (
            reporter == name
            or view is None
            or record is None
            or record.state not in WATCHED
            or (record.agent_id and hb.agent_id != record.agent_id)
            or seen is None
            or now - seen > settings.failure_seconds
        ):
            continue
        out.append((reporter, seen, view))
    return sorted(out, key=lambda report: report[0])


def heard_by_peers(
    state: ClusterState, observed: Observed, name: str, settings: CoordinatorSettings, now: float
) -> list[str]:
    """Peers whose membership heard ``name`` directly within the failure window, with a
    load report as fresh, saying its data path (NATS) is up: a node its peers hear but
    that cannot reach its data — or whose agent stopped measuring — is not doing its
    job, and is failed like a silent one."""
    return [
        reporter
        for reporter, seen, view in _peer_reports(state, observed, name, settings, now)
        if view.state == "alive"
        and view.heard_s is not None
        and (now - seen) + view.heard_s <= settings.failure_seconds
        and view.load_age_s is not None
        and (now - seen) + view.load_age_s <= settings.failure_seconds
        and view.connected is not False
    ]


def declared_dead(
    state: ClusterState, observed: Observed, settings: CoordinatorSettings, now: float
) -> list[tuple[str, str]]:
    """Live nodes their partition's gossip declares dead or left, not heard by the
    coordinator since the verdict and silent for ``gossip_silence`` (a heartbeat and a
    half): (name, reason)."""
    out = []
    for name, record in sorted(state.nodes.items()):
        if record.state not in WATCHED:
            continue
        last_heard = observed.last_seen.get(name, float("-inf"))
        if now - last_heard < settings.gossip_silence:
            continue  # it still heartbeats: a starved agent that will refute, not a dead one
        accusers = [
            (reporter, view.state)
            for reporter, seen, view in _peer_reports(state, observed, name, settings, now)
            if view.state in ("dead", "left") and last_heard < seen - view.since_s
        ]
        if accusers:
            verdict = "left" if all(v == "left" for _, v in accusers) else "dead"
            who = ", ".join(reporter for reporter, _ in accusers)
            out.append((name, f"declared {verdict} by its partition's gossip (reported by {who})"))
    return out


def fail(
    tx: Draft,
    node: str,
    reason: str,
    *,
    placer: Placer,
    settings: CoordinatorSettings,
    observed: Observed,
) -> None:
    tx.add(r.NodeFailed, node=node, reason=reason)
    log.warning("node %s failed: %s", node, reason)
    scheduler.move_fragments_off(
        tx,
        node,
        reason=f"node {node} failed",
        placer=placer,
        settings=settings,
        observed=observed,
        failed=True,
    )
