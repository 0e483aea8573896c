"""Fences on a real NATS server: the newest epoch holds a fragment's fence; older ones
can neither write nor take it back; a new checkpoint (a resubmission) is a new fence."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.nats.fences import Fence, Fenced, check, claim, fences, value_of
from spanflow.nats.streams import connect
from spanflow.security.signing import Signer, Verifier, new_key_pair
from spanflow.spec.cluster import Assignment, Fragment


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


def _signed_fence(signer: Signer, fid: str, epoch: int, node: str, checkpoint: str) -> Fence:
    """A fence as a locked node holds it: with the signed assignment as its proof."""
    pipeline = load_pipeline_text(
        "name: p\nsources: [{id: s, stream: IN, schema: {v: long}, to: [out]}]\n"
        "sinks: [{id: out, type: jetstream, stream: OUT, subject: out}]\n",
        "p.yaml",
    )
    fragment = Fragment(id=fid, pipeline="p", spec=pipeline)
    a = Assignment(fragment=fragment, node=node, epoch=epoch, checkpoint_dir=checkpoint)
    proof = signer.envelope(a.model_dump_json().encode())
    return Fence(fid, epoch, node, checkpoint, proof)


def test_locked_only_a_newer_signed_assignment_fences_a_writer(nats_url: str, uid: str) -> None:
    """Agents share one NATS identity: another node's host can put any fence value. A
    locked writer claims back a value without a coordinators' proof (forged) and a
    genuine older one put back; a newer signed assignment fences it."""
    private, public = new_key_pair()
    signer, verifier = Signer(private), Verifier(public)

    async def go() -> None:
        nc = await connect(nats_url)
        kv = await fences(nc.jetstream())
        fid, cp = f"s{uid}.f0", f"/cp/s{uid}"
        old, mine = (_signed_fence(signer, fid, e, "n1", cp) for e in (1, 2))
        await claim(kv, mine, verifier)
        forged = orjson.dumps({"epoch": 99, "node": "evil"})
        other = _signed_fence(signer, f"x{uid}.f0", 99, "evil", cp)  # signed, not for fid
        for value in (forged, b"not json", b'{"proof": 1}', value_of(other), value_of(old)):
            await kv.put(mine.key, value)
            with pytest.raises(Fenced):
                await check(kv, mine)  # open mode: any value fences (as before)
            await check(kv, mine, verifier)  # locked: claimed back ...
            held = await kv.get(mine.key)
            assert held.value == value_of(mine)  # ... with its own proof
        newer = _signed_fence(signer, fid, 3, "n2", cp)
        await claim(kv, newer, verifier)
        with pytest.raises(Fenced, match="epoch 3 holds its fence; this is 2"):
            await check(kv, mine, verifier)
        await nc.close()

    asyncio.run(go())
