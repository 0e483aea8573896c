"""Fixtures the cluster tests share: a whole local cluster (hub NATS, coordinators,
agents as processes) from a topology text, stopped after the test whatever happened.

A module asks for its cluster in one line::

    @pytest.fixture
    def cluster(start_cluster: StartCluster) -> LocalCluster:
        return start_cluster(TOPOLOGY, ha=True)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from spanflow.local.cluster import LocalCluster


class StartCluster(Protocol):
    def __call__(
        self, topology: str, *, home: str = "data", wait_nodes: float | None = None, **options: Any
    ) -> LocalCluster: ...


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[StartCluster]:
    """Start a :class:`LocalCluster` of ``topology`` (YAML text) under this test's
    directory (``home``), on free ports, with ``options`` as LocalCluster takes them;
    with ``wait_nodes``, wait that many seconds at most for every local node to
    register. Every cluster started is stopped at the end, a half-started one too."""
    started: list[LocalCluster] = []

    def start(
        topology: str, *, home: str = "data", wait_nodes: float | None = None, **options: Any
    ) -> LocalCluster:
        path = tmp_path / "topology.yaml"
        path.write_text(topology)
        cluster = LocalCluster(path, tmp_path / home, port=0, **options)
        started.append(cluster)
        cluster.start()
        if wait_nodes is not None:
            cluster.wait_for_nodes(timeout=wait_nodes)
        return cluster

    try:
        yield start
    finally:
        for cluster in reversed(started):
            cluster.stop()
