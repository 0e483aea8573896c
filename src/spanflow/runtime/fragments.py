"""The fragments of one node: what is assigned to it, what runs, and how each is doing.

:func:`spanflow.runtime.reconcile.reconcile` decides what to start, stop, savepoint or
forget; :class:`LocalFragments` carries the decisions out on the node's
:class:`~spanflow.runtime.executor.FragmentExecutor` and reports each event to the
activity log (through the ``report`` it is given). Driven from the agent's main thread
only (Spark's thread); heartbeats read ``runtime`` and ``desired`` from the NATS thread,
by copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from spanflow.clock import Clock
from spanflow.errors import SpanflowError
from spanflow.protocol.messages import ActivityEvent
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.runtime.executor import FragmentExecutor
from spanflow.runtime.load import FragmentLoad
from spanflow.runtime.reconcile import (
    Failure,
    Forget,
    Savepoint,
    Stop,
    reconcile,
    savepoint_marker,
)
from spanflow.runtime.shedding.policy import Running
from spanflow.spec.cluster import Assignment
from spanflow.spec.topology import Capabilities

log = logging.getLogger(__name__)

Report = Callable[..., None]
"""``report(event, runtime, savepoint_dir=None, detail=None)``: one activity record."""


class LocalFragments:
    def __init__(self, report: Report, clock: Clock, progress_every: float) -> None:
        self.desired: dict[str, Assignment] = {}
        """Fragment id → what the control plane (or the last-known copy) assigns here."""
        self.runtime: dict[str, FragmentRuntime] = {}
        """Fragment id → how it is doing, as heartbeats carry it."""
        self.executor: FragmentExecutor | None = None
        """Set once the node's Spark session runs."""
        self._failed: dict[str, Failure] = {}
        self._savepointed: set[tuple[str, int, str]] = set()
        self._report = report
        self._clock = clock
        self._progress_every = progress_every
        self._last_progress = 0.0

    def reconcile(self) -> None:
        """Make what runs match what is assigned."""
        ex = self.executor
        assert ex is not None
        running = {fid: f.assignment.epoch for fid, f in ex.fragments.items()}
        actions = reconcile(
            self.desired,
            running,
            self._failed,
            self._savepointed,
            set(self.runtime),
            self._clock.monotonic(),
        )
        for action in actions:
            if isinstance(action, Stop):
                stopped = ex.fragments[action.fragment_id].assignment
                ex.stop(action.fragment_id)
                self._report("stopped", stopped_runtime(stopped))
                self.runtime.pop(action.fragment_id, None)
            elif isinstance(action, Forget):
                self.runtime.pop(action.fragment_id, None)
            elif isinstance(action, Savepoint):
                self._savepoint(ex, action.assignment)
            else:
                self._start(ex, action.assignment)

    def _savepoint(self, ex: FragmentExecutor, a: Assignment) -> None:
        path = ex.savepoint(a)
        self._savepointed.add(savepoint_marker(a))
        rt = stopped_runtime(a)
        self.runtime[a.fragment.id] = rt
        self._report("savepointed", rt, savepoint_dir=path)

    def _start(self, ex: FragmentExecutor, a: Assignment) -> None:
        fid = a.fragment.id
        self.runtime[fid] = FragmentRuntime(fragment_id=fid, epoch=a.epoch, status="starting")
        try:
            ex.start(a)
        except (SpanflowError, FileNotFoundError) as exc:  # the fragment itself is wrong
            self._fail(a, exc, fatal=True)
            return
        except Exception as exc:  # e.g. the broker is briefly unreachable: retry
            self._fail(a, exc, fatal=False)
            return
        self._failed.pop(fid, None)
        rt = ex.runtime(fid)
        self.runtime[fid] = rt
        self._report("started", rt)

    def _fail(self, a: Assignment, exc: BaseException, *, fatal: bool) -> None:
        fid = a.fragment.id
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        log.error(
            "fragment %s failed to start%s: %s", fid, "" if fatal else " (will retry)", message
        )
        self._failed[fid] = Failure(a.epoch, self._clock.monotonic(), fatal)
        rt = FragmentRuntime(
            fragment_id=fid, epoch=a.epoch, status="failed" if fatal else "failing", error=message
        )
        self.runtime[fid] = rt
        event: ActivityEvent = "failed" if fatal else "progress"
        self._report(event, rt)

    def observe(self) -> None:
        """Read every fragment's progress; report it every ``progress_every`` seconds."""
        ex = self.executor
        assert ex is not None
        for fid in list(ex.fragments):
            try:
                self.runtime[fid] = ex.runtime(fid)
            except Exception as exc:  # observation must never stop the agent
                log.warning("cannot read progress of %s: %s", fid, exc)
        now = self._clock.monotonic()
        if now - self._last_progress >= self._progress_every:
            self._last_progress = now
            for fid in ex.fragments:
                if fid in self.runtime:
                    self._report("progress", self.runtime[fid])

    def running(self) -> list[Running]:
        """Fragments running here, with what the shedding policy weighs."""
        out = []
        for fid, rt in list(self.runtime.items()):
            a = self.desired.get(fid)
            if rt.status != "running" or a is None or a.action != "run":
                continue
            load = FragmentLoad.of(rt, int(a.fragment.spec.trigger * 1000))
            slots = a.fragment.spec.fragment_slots()
            out.append(Running(fid, a.priority, a.latency_budget, load, slots))
        return out

    def slots_taken(self, caps: Capabilities) -> int:
        """Fragment slots the assigned fragments take, counted as the planner does."""
        return sum(a.fragment.slots_on(caps) for a in list(self.desired.values()))


def stopped_runtime(a: Assignment) -> FragmentRuntime:
    return FragmentRuntime(fragment_id=a.fragment.id, epoch=a.epoch, status="stopped", error=None)
