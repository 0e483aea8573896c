"""The agent's decision: given what is assigned, what runs, what failed and the time,
which fragments to stop, savepoint and start. Pure (no Spark, no NATS, no clock of its
own), so every rule is tested with plain values; the agent executes the actions in the
order given (stops first, so a fragment's slot is free before another starts).

The rules:

- running but no longer assigned → stop (and say so);
- assigned with ``action: savepoint`` → savepoint once per (fragment, epoch, target);
- assigned and running at the assigned epoch → nothing;
- assigned at an epoch whose start failed fatally (the fragment itself is wrong) →
  nothing until a new epoch is assigned;
- failed with a retryable error less than ``retry_after`` seconds ago → wait;
- otherwise → start (a new epoch replaces what ran at the old one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spanflow.spec.cluster import Assignment

RETRY_AFTER = 5.0
"""Seconds before a fragment whose start failed for a passing reason is tried again."""


@dataclass(frozen=True)
class Failure:
    """A start that failed: at which epoch, when (monotonic seconds), and whether
    retrying can help."""

    epoch: int
    at: float
    fatal: bool


@dataclass(frozen=True)
class Stop:
    fragment_id: str


@dataclass(frozen=True)
class Savepoint:
    assignment: Assignment


@dataclass(frozen=True)
class Start:
    assignment: Assignment


@dataclass(frozen=True)
class Forget:
    """Drop what is remembered of a fragment neither assigned nor running."""

    fragment_id: str


Action = Stop | Savepoint | Start | Forget


def savepoint_marker(a: Assignment) -> tuple[str, int, str]:
    return (a.fragment.id, a.epoch, a.savepoint_dir or "")


def reconcile(
    desired: Mapping[str, Assignment],
    running: Mapping[str, int],
    failures: Mapping[str, Failure],
    savepointed: set[tuple[str, int, str]],
    known: set[str],
    now: float,
    retry_after: float = RETRY_AFTER,
) -> list[Action]:
    """Actions that make ``running`` (fragment → epoch) match ``desired``. ``known``:
    fragments the agent keeps a runtime record of."""
    actions: list[Action] = [Stop(fid) for fid in running if fid not in desired]
    actions += [Forget(fid) for fid in sorted(known) if fid not in desired and fid not in running]
    for fid, a in desired.items():
        if a.action == "savepoint":
            if savepoint_marker(a) not in savepointed:
                actions.append(Savepoint(a))
            continue
        if running.get(fid) == a.epoch:
            continue
        if not _held_back(failures.get(fid), a.epoch, now, retry_after):
            actions.append(Start(a))
    return actions


def _held_back(failed: Failure | None, epoch: int, now: float, retry_after: float) -> bool:
    """Whether a failed start at this epoch keeps the fragment from starting now."""
    if failed is None or failed.epoch != epoch:
        return False
    return failed.fatal or now - failed.at < retry_after
