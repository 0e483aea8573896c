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

How long a lease lasts (:func:`lease_for`): on a replicated NATS cluster the lease
bucket is itself a Raft group; when the server that leads it dies, its followers wait
an election timeout (4 to 9 s in nats-server), campaign (up to 0.8 s) and answer again.
A lease shorter than that failover expires while nobody can renew it, and a NATS
server kill alone would change the coordinator. A leader whose renewal gets no answer
tries again every ``LEASE_RETRY + LEASE_CALL_TIMEOUT`` (1.25 s) instead of waiting a
renewal period, so the lease must cover the renewal period (a third of the lease), a
failover, one retry and the margin a leader keeps before expiry:
``L ≥ L/3 + F + R + M``, ``L = 1.5·(F + R + M)`` with ``F = 9 + 0.8 + 1 = 10.8 s``
(the maximum election timeout, the maximum campaign, one Raft heartbeat), ``R = 1.25
s``, ``M = 0.5 s``: 18.8 s, rounded up to 19 s. A single server has no failover: 3 s.
A leader whose renewal gets *no answer* keeps office until its lease would have
expired counted from its last good renewal (:func:`keeps_office`); a renewal
*refused* (another replica holds the key) ends it at once — unless the key is the
leader's own, written by an earlier call that timed out but was stored after all.
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, Field

from spanflow.control import records as r
from spanflow.control.state import ClusterState, Draft

LEASE_KEY = "leader"

RAFT_MAX_ELECTION_TIMEOUT = 9.0
"""nats-server's ``maxElectionTimeoutDefault``: the longest a follower waits for a lost
leader before it campaigns."""
RAFT_MAX_CAMPAIGN = 0.8
RAFT_HEARTBEAT = 1.0
JETSTREAM_FAILOVER = RAFT_MAX_ELECTION_TIMEOUT + RAFT_MAX_CAMPAIGN + RAFT_HEARTBEAT
"""The longest a replicated bucket has no leader after its leader's server died."""
SINGLE_SERVER_LEASE = 3.0
RENEWALS_PER_LEASE = 3
RENEWAL_MARGIN = 0.5
"""Seconds a leader that cannot renew gives up office before its lease would expire
(clock drift between it and the server that times the key)."""
LEASE_CALL_TIMEOUT = 1.0
"""Seconds one lease read or write may take: a leader whose renewal gets no answer
must try again soon, not wait out the client's default time-out (5 s)."""
LEASE_RETRY = 0.25
"""Seconds between renewal attempts while the lease bucket does not answer: the
bucket's new Raft leader may answer any moment, and the lease runs out meanwhile."""


def lease_for(servers: int) -> float:
    """The lease for a control plane on ``servers`` NATS servers (see the module doc)."""
    if servers <= 1:
        return SINGLE_SERVER_LEASE
    unanswered = JETSTREAM_FAILOVER + LEASE_RETRY + LEASE_CALL_TIMEOUT + RENEWAL_MARGIN
    return float(math.ceil(unanswered * RENEWALS_PER_LEASE / (RENEWALS_PER_LEASE - 1)))


def keeps_office(last_renewed: float, now: float, lease_seconds: float) -> bool:
    """Whether a leader whose renewals get no answer (NATS electing) still leads: until
    its lease, counted from the last renewal that succeeded, is about to expire."""
    return now < last_renewed + lease_seconds - RENEWAL_MARGIN


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
