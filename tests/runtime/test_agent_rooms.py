"""The node agent's rooms decide with a fake clock: when a failed fragment is tried
again, when progress is reported, how long a reconnecting data path counts as up.

The executor here is a stand-in that records what it is asked (these are tests of the
decisions, not of Spark: the agent runs real fragments in tests/cluster/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spanflow.clock import FakeClock
from spanflow.errors import SpecError
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.protocol.rest import Registered
from spanflow.runtime.agent_settings import AgentSettings, AgentTimings
from spanflow.runtime.control_link import ControlLink
from spanflow.runtime.fragments import LocalFragments
from spanflow.runtime.last_known import RegistrationCache
from spanflow.runtime.reconcile import RETRY_AFTER
from spanflow.runtime.reports import Reports
from spanflow.runtime.shedding.policy import Shedder
from spanflow.spec.cluster import Assignment, NodeRecord
from spanflow.spec.topology import Capabilities, NodeSpec
from tests.runtime.test_reconcile import assigned


@dataclass
class StandInExecutor:
    """Starts fail with the queued errors first; then the fragment 'runs'."""

    errors: list[Exception] = field(default_factory=list)
    fragments: dict[str, Any] = field(default_factory=dict)
    starts: int = 0

    def start(self, a: Assignment) -> None:
        self.starts += 1
        if self.errors:
            raise self.errors.pop(0)
        self.fragments[a.fragment.id] = SimpleNamespace(assignment=a)

    def runtime(self, fid: str) -> FragmentRuntime:
        epoch = self.fragments[fid].assignment.epoch
        return FragmentRuntime(fragment_id=fid, epoch=epoch, status="running")

    def stop(self, fid: str) -> None:
        self.fragments.pop(fid)


def fragments_on(executor: StandInExecutor, clock: FakeClock) -> tuple[LocalFragments, list]:
    reported: list[tuple[str, FragmentRuntime]] = []
    local = LocalFragments(lambda event, rt, **_: reported.append((event, rt)), clock, 5.0)
    local.executor = executor  # type: ignore[assignment]
    return local, reported


def test_a_transient_start_failure_is_tried_again_only_after_its_back_off() -> None:
    clock, executor = FakeClock(), StandInExecutor(errors=[ConnectionError("broker away")])
    local, reported = fragments_on(executor, clock)
    local.desired = {"p.f0": assigned("p.f0", 1)}
    local.reconcile()
    assert local.runtime["p.f0"].status == "failing" and executor.starts == 1
    clock.advance(RETRY_AFTER - 0.5)
    local.reconcile()
    assert executor.starts == 1  # still waiting
    clock.advance(1.0)
    local.reconcile()
    assert executor.starts == 2 and local.runtime["p.f0"].status == "running"
    assert [event for event, _ in reported] == ["progress", "started"]


def test_a_broken_fragment_is_reported_failed_and_never_retried() -> None:
    clock, executor = FakeClock(), StandInExecutor(errors=[SpecError("no such stream")])
    local, reported = fragments_on(executor, clock)
    local.desired = {"p.f0": assigned("p.f0", 1)}
    local.reconcile()
    clock.advance(10 * RETRY_AFTER)
    local.reconcile()
    assert executor.starts == 1 and local.runtime["p.f0"].status == "failed"
    assert [event for event, _ in reported] == ["failed"]
    assert "no such stream" in (local.runtime["p.f0"].error or "")
    local.desired = {"p.f0": assigned("p.f0", 2)}  # a new epoch is a new try
    local.reconcile()
    assert executor.starts == 2 and local.runtime["p.f0"].status == "running"


def test_progress_is_reported_once_per_period_and_a_removed_fragment_is_stopped() -> None:
    clock, executor = FakeClock(), StandInExecutor()
    local, reported = fragments_on(executor, clock)
    local.desired = {"p.f0": assigned("p.f0", 1)}
    local.reconcile()
    for _ in range(10):  # 10 looks over 4.5 s: one progress report (the first look)
        local.observe()
        clock.advance(0.5)
    local.observe()  # 5 s after the first
    assert [event for event, _ in reported] == ["started", "progress", "progress"]
    local.desired = {}
    local.reconcile()
    assert reported[-1][0] == "stopped" and not executor.fragments and not local.runtime


class Connection:
    is_connected, is_reconnecting = True, False


def test_a_reconnecting_data_path_is_up_for_the_grace_and_down_after(tmp_path: Path) -> None:
    clock = FakeClock()
    settings = AgentSettings(name="n1", site="s", coordinator_url="http://127.0.0.1:9")
    link = ControlLink(settings, RegistrationCache(tmp_path, "n1"), clock)
    local, _ = fragments_on(StandInExecutor(), clock)
    reports = Reports("n1", "a1", local, link, Shedder(settings.shedding), Capabilities(), clock)
    assert not reports.data_path_up()  # no connection yet
    nc = Connection()
    reports.client = SimpleNamespace(nc=nc)  # type: ignore[assignment]
    assert reports.data_path_up()
    nc.is_connected, nc.is_reconnecting = False, True
    grace = AgentTimings.lan().reconnect_grace
    assert reports.data_path_up()
    clock.advance(grace - 1)
    assert reports.data_path_up()
    clock.advance(2)
    assert not reports.data_path_up()
    nc.is_connected, nc.is_reconnecting = True, False
    assert reports.data_path_up()
    nc.is_connected, nc.is_reconnecting = False, True  # a new outage has its own grace
    clock.advance(grace - 1)
    assert reports.data_path_up()


def test_a_wan_agent_waits_longer_for_everything_a_lan_agent_waits_for() -> None:
    lan, wan = AgentTimings.lan(), AgentTimings.wan()
    for name in ("control_patience", "reconnect_grace", "register_timeout", "report_timeout"):
        assert getattr(wan, name) > getattr(lan, name), name


def test_a_restarted_node_starts_from_its_saved_registration_when_due_not_a_back_off_later(
    tmp_path: Path,
) -> None:
    """The back-off's delays (0.5, 1, 2, 4, 8 s …) never carry the wait past
    ``offline_after``: an edge node rebooted during an uplink cut starts on time."""
    clock = FakeClock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # time passes only when the link waits
        slept.append(seconds)
        clock.advance(seconds)

    cache = RegistrationCache(tmp_path, "edge-1")
    saved = Registered(
        nats_url="nats://127.0.0.1:4222",
        node=NodeRecord(spec=NodeSpec(name="edge-1", site="plant")),
        heartbeat_interval=1.0,
    )
    cache.save(saved)
    for due in (0.2, 2.0, 5.0, 9.0):  # 9 s: the last delay before it would be 8 s
        settings = AgentSettings(
            name="edge-1", site="plant", coordinator_url="http://127.0.0.1:9", offline_after=due
        )
        link = ControlLink(settings, cache, clock)
        link.sleep = sleep
        started, slept[:] = clock.monotonic(), []
        assert link.register({"name": "edge-1"}) == saved and link.offline
        assert clock.monotonic() - started == pytest.approx(due), slept
