"""What nodes tell the coordinators: heartbeats and activity reports, each taken only
when sealed by the node it names (security/node_seal.py), then turned into decisions
by the control rooms (topology manager, reconciler) on the leader. A standby keeps
the figures, never decides. Also the savepoint reports a new leader reads back from
the activity stream: one may have completed while no coordinator was listening.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from spanflow.clock import Clock
from spanflow.control import reconciler, topology_manager
from spanflow.control.settings import CoordinatorSettings
from spanflow.control.state import ClusterState, Draft, Observed
from spanflow.nats.cluster import ACTIVITY_STREAM, activity_subject
from spanflow.protocol.messages import Activity, Heartbeat
from spanflow.security.node_seal import SEAL_HEADER, ReportGate

log = logging.getLogger(__name__)

T = TypeVar("T")


class Office(Protocol):
    """What the reports need of the coordinator replica that receives them."""

    settings: CoordinatorSettings
    state: ClusterState
    observed: Observed
    clock: Clock
    reports: ReportGate
    nc: Client | None
    leading: bool

    async def decide(self, decide: Callable[[Draft], T]) -> T: ...

    def schedule(self, tx: Draft, exclude: list[str] | None = None) -> None: ...


class NodeReports:
    """Takes a replica's node reports (its NATS subscriptions call in here)."""

    def __init__(self, office: Office) -> None:
        self._office = office
        self._pending: set[asyncio.Task[None]] = set()
        """Heartbeat decisions under way (kept so none is collected mid-flight)."""

    async def savepointed(self) -> list[Activity]:
        """The last 'savepointed' report of every assignment taking a savepoint: it may
        have completed while no coordinator was listening."""
        office = self._office
        assert office.nc is not None
        js = office.nc.jetstream()
        out = []
        for a in list(office.state.assignments.values()):
            if a.action != "savepoint":
                continue
            subject = activity_subject(a.node, a.fragment.id, "savepointed")
            try:
                msg = await js.get_last_msg(ACTIVITY_STREAM, subject)
                act = Activity.model_validate_json(msg.data or b"")
            except (NotFoundError, ValidationError):
                continue
            sealed = (msg.headers or {}).get(SEAL_HEADER)
            # A stored report: its age is no sign of a replay (now = its own time).
            if office.reports.refusal(a.node, subject, msg.data or b"", sealed, act.at, act.at):
                continue
            out.append(act)
        return out

    async def on_heartbeat(self, msg: Msg) -> None:
        hb = _parsed(msg, Heartbeat, "heartbeat")
        if hb is None or not self._sealed_by_node(msg, hb.node, (hb.agent_id, hb.seq, hb.at)):
            return
        office = self._office
        now = office.clock.monotonic()
        heard = topology_manager.heard(
            office.state, office.observed, hb, now, office.settings.overload
        )
        if not heard or not office.leading:
            return  # the common case: progress only, no decision to take

        # Decide in a task of its own: a commit waiting for the log (an election after
        # a NATS server died) must not hold up the heartbeats behind this one, or
        # every node would look silent when it ends.
        task = asyncio.create_task(self._heartbeat_decision(hb.node, now))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _heartbeat_decision(self, node: str, now: float) -> None:
        def decide(tx: Draft) -> bool:
            recovered = topology_manager.recover(tx, node)
            if recovered:
                self._office.schedule(tx)
            reconciler.refresh_states(tx, self._office.observed)
            return recovered

        try:
            if await self._office.decide(decide):
                self._office.observed.joined(node, now)
        except Exception as exc:  # logged: the next heartbeat decides again
            log.warning("decision on %s's heartbeat not taken: %s", node, exc)

    async def on_activity(self, msg: Msg) -> None:
        act = _parsed(msg, Activity, "activity report")
        if act is None or not self._sealed_by_node(msg, act.node, act.at):
            return
        if not self._office.leading:
            if reconciler.current_assignment(self._office.state, act) is not None:
                self._office.observed.runtime[act.runtime.fragment_id] = act.runtime
            return

        def decide(tx: Draft) -> None:
            if reconciler.current_assignment(tx.state, act) is None:
                return  # about a placement that is no longer current
            self._office.observed.runtime[act.runtime.fragment_id] = act.runtime
            reconciler.on_activity(tx, self._office.observed, act, self._office.settings)

        await self._office.decide(decide)

    def _sealed_by_node(self, msg: Msg, node: str, when: tuple[str, int, float] | float) -> bool:
        """Whether a heartbeat (``when`` = agent id, sequence, time) or an activity
        report (its time) was sent by ``node`` itself (security/node_seal.py); a
        refusal is logged once a minute per node."""
        gate, now = self._office.reports, self._office.clock.time()
        sealed = (msg.headers or {}).get(SEAL_HEADER)
        if isinstance(when, tuple):
            why = gate.heartbeat_refusal(node, msg.subject, msg.data, sealed, when, now)
        else:
            why = gate.refusal(node, msg.subject, msg.data, sealed, when, now)
        if why is not None and gate.worth_logging(node, now):
            log.warning("report on %s refused: %s", msg.subject, why)
        return why is None


M = TypeVar("M", Heartbeat, Activity)


def _parsed(msg: Msg, model: type[M], what: str) -> M | None:
    """A node's report, or None (logged) when it is not one: a bad message is dropped,
    never the subscription."""
    try:
        return model.model_validate_json(msg.data)
    except ValidationError as exc:
        log.warning("bad %s on %s: %s", what, msg.subject, exc)
        return None
