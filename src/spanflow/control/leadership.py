"""Leadership room: which coordinator replica decides.

Replicas share one control log. Exactly one of them — the leader — takes decisions;
the others (standbys) tail the log through the same ``apply`` and answer reads. The
leader holds a *lease*: a key in a KV bucket whose entries expire (``lease_seconds``)
unless renewed, written by compare-and-set on its revision, so two replicas cannot
both renew it. A replica that finds no lease creates one (only one create succeeds)
and takes office: it appends a ``leader`` record with the next epoch.

The lease decides who *should* write; the log decides who *can*: every append names
the sequence it expects to follow, so a deposed leader that has not noticed yet is
refused the moment it writes (its view is behind the new leader's ``leader`` record).
A replica restarted under the same name finds the lease still its own and renews it
without a new epoch — names must be unique per replica.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from spanflow.control import records as r
from spanflow.control.state import ClusterState, Draft

LEASE_KEY = "leader"


class Lease(BaseModel):
    """The value of the lease key."""

    holder: str
    url: str | None = Field(default=None, description="Where the holder's API answers.")
    revision: int = Field(default=0, description="KV revision it was read at (not stored).")

    def value(self) -> bytes:
        return self.model_dump_json(exclude={"revision"}).encode()


class Step(StrEnum):
    CAMPAIGN = "campaign"  # no lease: try to create it
    RENEW = "renew"  # the lease is ours: renew it (compare-and-set on its revision)
    FOLLOW = "follow"  # another replica holds it: tail the log


def next_step(me: str, lease: Lease | None) -> Step:
    if lease is None:
        return Step.CAMPAIGN
    if lease.holder == me:
        return Step.RENEW
    return Step.FOLLOW


def take_office(state: ClusterState, me: str, at: float) -> Draft:
    """The draft a new leader starts with: a ``leader`` record of the next epoch, unless
    the log already names it leader (its own restart)."""
    if state.leader == me:
        return Draft(state, at, epoch=state.leader_epoch)
    tx = Draft(state, at, epoch=state.leader_epoch + 1)
    tx.add(r.LeaderElected, leader=me)
    return tx
