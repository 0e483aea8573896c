"""Checkpoint locations: a URL stays a URL (``Path`` would turn ``hdfs://nn:8020/x`` into
``hdfs:/nn:8020/x``), a local path stays a path."""

from __future__ import annotations

from pathlib import Path

from spanflow.spec import locations


def test_urls_are_joined_as_urls() -> None:
    assert (
        locations.join("hdfs://nn:8020/x", "checkpoints", "p") == "hdfs://nn:8020/x/checkpoints/p"
    )
    assert locations.join("jetstream://spanflow/", "/a/", "b") == "jetstream://spanflow/a/b"
    assert locations.join("jetstream://hub@spanflow", "m") == "jetstream://hub@spanflow/m"
    assert locations.join("file:///tmp/s", "c") == "file:///tmp/s/c"


def test_local_paths_stay_paths() -> None:
    assert locations.join("data/cluster", "checkpoints", "p") == str(
        Path("data/cluster/checkpoints/p")
    )
    assert not locations.is_url("data/cluster") and not locations.is_url(Path("/x"))
    assert locations.resolve("data") == str(Path("data").resolve())
    assert locations.resolve("hdfs://nn:8020/x") == "hdfs://nn:8020/x"
    assert locations.scheme("JetStream://s/x") == "jetstream"
    assert locations.scheme("/tmp/x") is None
