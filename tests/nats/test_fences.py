"""Fences on a real NATS server: the newest epoch holds a fragment's fence; older ones
can neither write nor take it back; a new checkpoint (a resubmission) is a new fence."""

from __future__ import annotations

import asyncio

import pytest

from spanflow.nats.fences import Fence, Fenced, check, claim, fences
from spanflow.nats.streams import connect


def test_the_newest_epoch_holds_the_fence(nats_url: str, uid: str) -> None:
    async def go() -> None:
        nc = await connect(nats_url)
        kv = await fences(nc.jetstream())
        old = Fence(f"p{uid}.f0", 1, "n1", f"/cp/p{uid}/run-a/f0")
        new = Fence(f"p{uid}.f0", 2, "n2", old.checkpoint)
        with pytest.raises(Fenced, match="its fence is gone"):
            await check(kv, old)  # never claimed
        await claim(kv, old)
        await claim(kv, old)  # idempotent
        await check(kv, old)
        await claim(kv, new)  # the fragment moved: n2 claims with the next epoch
        await check(kv, new)
        with pytest.raises(Fenced, match="epoch 2 holds its fence; this is 1"):
            await check(kv, old)
        with pytest.raises(Fenced, match="epoch 2 runs elsewhere; this is 1"):
            await claim(kv, old)  # n1, back from a cut, cannot take it back
        await check(kv, new)
        # A resubmitted pipeline writes to a new checkpoint: epochs start again.
        fresh = Fence(old.fragment_id, 1, "n1", f"/cp/p{uid}/run-b/f0")
        assert fresh.key != old.key
        await claim(kv, fresh)
        await check(kv, fresh)
        await nc.close()

    asyncio.run(go())


def test_concurrent_claims_leave_the_highest_epoch(nats_url: str, uid: str) -> None:
    async def go() -> list[BaseException | None]:
        nc = await connect(nats_url)
        kv = await fences(nc.jetstream())
        claims = [Fence(f"c{uid}.f0", e, f"n{e}", "/cp/c") for e in (3, 1, 5, 2, 4)]
        results = await asyncio.gather(*(claim(kv, f) for f in claims), return_exceptions=True)
        await check(kv, claims[2])  # epoch 5
        await nc.close()
        return list(results)

    results = asyncio.run(go())
    assert all(r is None or isinstance(r, Fenced) for r in results)
