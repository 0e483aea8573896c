"""Fault points hold a process only when a test armed them, once per arming."""

from __future__ import annotations

import threading

from spanflow.faults import FAULT_DIR_ENV, pause_here
from tests.helpers import wait_for


def test_an_unarmed_point_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    called = []
    pause_here("p", prepare=lambda: called.append(1))
    assert called == [] and list(tmp_path.iterdir()) == []


def test_an_armed_point_prepares_holds_until_released_and_fires_once(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    (tmp_path / "p.arm").touch()
    prepared, passed = [], threading.Event()

    def worker() -> None:
        pause_here("p", prepare=lambda: prepared.append(1))
        passed.set()
        pause_here("p")  # disarmed: passes straight through
        passed.set()

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    wait_for((tmp_path / "p.reached").exists, timeout=10)
    assert prepared == [1] and not passed.is_set() and not (tmp_path / "p.arm").exists()
    (tmp_path / "p.release").touch()
    t.join(10)
    assert passed.is_set() and not t.is_alive()


def test_without_the_environment_variable_an_armed_file_is_ignored(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULT_DIR_ENV, raising=False)
    (tmp_path / "p.arm").touch()
    pause_here("p")
    assert (tmp_path / "p.arm").exists()
