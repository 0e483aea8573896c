"""The leader lease's bucket: the I/O behind :mod:`spanflow.control.leadership`'s
decisions. One key (``leader``) whose revision every write must name: a create or a
compare-and-set renewal, so two replicas can never both believe they hold it. The
bucket's TTL is the lease's length, whoever created it.
"""

from __future__ import annotations

import asyncio
import logging

from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, KeyNotFoundError
from nats.js.kv import KeyValue

from spanflow.control import leadership
from spanflow.control.leadership import LEASE_KEY, Lease
from spanflow.nats.cluster import LEADER_BUCKET, ensure_kv

log = logging.getLogger(__name__)


class LeaseBucket:
    """Reads and writes the lease on behalf of one replica (``mine``)."""

    def __init__(self, kv: KeyValue, mine: Lease, seconds: float) -> None:
        self.kv = kv
        self.mine = mine
        self.seconds = seconds
        """How long a lease lasts: the bucket's own TTL, so replicas configured
        differently never disagree."""

    @classmethod
    async def open(
        cls, js: JetStreamContext, mine: Lease, wanted: float, replicas: int | None
    ) -> LeaseBucket:
        """The bucket (created with TTL ``wanted`` if missing), timed by its own TTL."""
        kv = await ensure_kv(js, LEADER_BUCKET, ttl=wanted, replicas=replicas)
        info = await js.stream_info(f"KV_{LEADER_BUCKET}")
        actual = float(info.config.max_age or 0) or wanted
        if actual != wanted:
            log.warning(
                "lease bucket times leases at %.1f s (not %.1f s): using it", actual, wanted
            )
        return cls(kv, mine, actual)

    async def read(self) -> Lease | None:
        try:
            entry = await asyncio.wait_for(self.kv.get(LEASE_KEY), leadership.LEASE_CALL_TIMEOUT)
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        return Lease.model_validate_json(entry.value).model_copy(
            update={"revision": entry.revision or 0}
        )

    async def hold(self, step: leadership.Step, lease: Lease | None) -> bool:
        """Create or renew the lease as ``step`` says; False when another replica
        holds it (the create or compare-and-set is refused)."""
        try:
            if step == leadership.Step.CAMPAIGN:
                await asyncio.wait_for(
                    self.kv.create(LEASE_KEY, self.mine.value()), leadership.LEASE_CALL_TIMEOUT
                )
                return True
            if step == leadership.Step.RENEW:
                assert lease is not None
                await self._renew(lease.revision)
                return True
        except BadRequestError:  # KeyWrongLastSequenceError: someone wrote it since
            return await self._renew_if_ours()
        return False

    async def _renew(self, revision: int) -> None:
        await asyncio.wait_for(
            self.kv.update(LEASE_KEY, self.mine.value(), last=revision),
            leadership.LEASE_CALL_TIMEOUT,
        )

    async def _renew_if_ours(self) -> bool:
        """After a refused create or renewal: an earlier call of ours that timed out
        may have been stored after all (the lease is ours, at a newer revision). Then
        renew it at that revision — a leader must not step down over its own write,
        and its lease is counted from this renewal."""
        current = await self.read()
        if current is None or current.holder != self.mine.holder:
            return False
        try:
            await self._renew(current.revision)
        except BadRequestError:
            return False
        return True
