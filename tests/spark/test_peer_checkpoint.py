"""A hot standby replica far behind its peer starts from the peer's checkpoint, cut at
the peer's last commit; one only a little behind keeps its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spanflow.spark.checkpoints.peer_checkpoint import BEHIND, catch_up_from_peer


def _query(root: Path, commits: int, offsets: int, state: str) -> None:
    """A query checkpoint with commits 0..commits-1, offsets 0..offsets-1 and a state file."""
    for log, n in (("commits", commits), ("offsets", offsets)):
        (root / log).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / log / str(i)).write_text(f"{log} {i}")
    (root / "state" / "0" / "0").mkdir(parents=True, exist_ok=True)
    (root / "state" / "0" / "0" / "1.changelog").write_text(state)
    (root / "metadata").write_text('{"id": "q"}')


def _batches(log: Path) -> list[int]:
    return sorted(int(p.name) for p in log.iterdir() if p.name.isdigit())


def test_a_replica_far_behind_takes_the_peers_checkpoint_cut_at_its_last_commit(
    spark: Any, tmp_path: Path
) -> None:
    peer, own = tmp_path / "peer", tmp_path / "own"
    _query(peer / "p" / "far", commits=20, offsets=21, state="peer's")  # batch 20 running
    _query(own / "p" / "far", commits=3, offsets=4, state="own")
    _query(peer / "p" / "near", commits=20, offsets=20, state="peer's")
    _query(own / "p" / "near", commits=20 - BEHIND, offsets=20 - BEHIND, state="own")

    seeded = catch_up_from_peer(spark, str(own), str(peer))

    assert seeded == ["p/far"]
    far = own / "p" / "far"
    assert _batches(far / "commits") == list(range(20))
    assert _batches(far / "offsets") == list(range(20))  # the peer's batch in flight dropped
    assert (far / "state" / "0" / "0" / "1.changelog").read_text() == "peer's"
    near = own / "p" / "near"
    assert (near / "state" / "0" / "0" / "1.changelog").read_text() == "own"
    assert _batches(near / "commits") == list(range(20 - BEHIND))
    assert not list(tmp_path.rglob("*.peer"))  # no staging copy left behind


def test_a_fresh_replica_of_a_fresh_peer_has_nothing_to_take(spark: Any, tmp_path: Path) -> None:
    assert catch_up_from_peer(spark, str(tmp_path / "own"), str(tmp_path / "peer")) == []
