"""Alarms people can act on: one record per key per incident, not one per reading.

A filter over a limit (``temperature > 90``) or a pattern that matches every
overlapping run fires on every reading of an overheating machine: 300 rows for one
incident. ``suppress`` passes a key's first record and holds back the ones that follow:

* ``until: period`` (default) — the next one passes once ``once_per`` has gone by
  since the last record passed (a reminder every ``once_per`` while it lasts);
* ``until: quiet`` — the next one passes only after the key has been quiet (no
  record at all) for ``once_per``: one record per incident, however long it lasts.

Each passed record carries ``suppressed``: how many of the key's records were held
back since the one passed before it. Time is the record's event time when the stream
has one (replays and backlogs give the same answer), else the time it is processed.
A sink's ``once_per`` (and ``until``) is this step in front of it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from spanflow.spec.durations import Duration
from spanflow.spec.steps.base import Placement, StepBase

SUPPRESSED = "suppressed"
Until = Literal["period", "quiet"]


class SuppressStep(StepBase):
    """Passes a key's first record, then holds back its records for ``once_per``."""

    placement: ClassVar[Placement] = Placement.KEYED

    type: Literal["suppress"] = "suppress"
    once_per: Duration = Field(
        gt=0, le=30 * 86400, description="How long a key's later records are held back."
    )
    until: Until = Field(
        default="period",
        description="'period': one record per once_per while they keep coming; 'quiet': one "
        "per incident — the next passes after the key sent nothing for once_per.",
    )
