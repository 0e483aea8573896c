"""An agent never gives up registering, and a node that registered before starts
from its saved registration while no coordinator answers. A real coordinator (its
REST server on a real port) and NATS server; no Spark."""

from __future__ import annotations

import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from spanflow.api.topology_loader import load_topology_text
from spanflow.control.coordinator import Coordinator, CoordinatorSettings
from spanflow.nats.server import EmbeddedNats
from spanflow.runtime.agent import AgentSettings, NodeAgent
from spanflow.runtime.last_known import RegistrationCache
from spanflow.server.app import create_app
from tests.helpers import wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import uvicorn

TOPOLOGY = """
sites: [{name: plant, retention: {max_bytes: 1GiB}}, {name: cloud, kind: cloud}]
nodes: [{name: edge-1, site: plant}]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def coordinator_on(port: int, nats_url: str, state: Path) -> Iterator[None]:
    settings = CoordinatorSettings(
        nats_url=nats_url,
        state_dir=str(state),
        topology=load_topology_text(TOPOLOGY),
        heartbeat_interval=5.0,
    )
    config = uvicorn.Config(
        create_app(Coordinator(settings)), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=30)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def agent(port: int, state: Path, offline_after: float = 10.0) -> NodeAgent:
    return NodeAgent(
        AgentSettings(
            name="edge-1",
            site="plant",
            coordinator_url=f"http://127.0.0.1:{port}",
            state_dir=state,
            offline_after=offline_after,
        )
    )


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path / "nats") as server:
        yield server


def test_an_agent_started_before_its_coordinator_registers_once_it_answers(
    nats: EmbeddedNats, tmp_path: Path
) -> None:
    port = free_port()
    first = agent(port, tmp_path / "agents")
    answers: list[object] = []
    thread = threading.Thread(target=lambda: answers.append(first.register()), daemon=True)
    thread.start()
    started = time.monotonic()
    # Several attempts fail (back-off 0.5, 1, 2 s …): it is still trying, with nothing
    # saved to start from.
    wait_for(lambda: time.monotonic() - started > 3.0, timeout=10)
    assert thread.is_alive() and not answers
    with coordinator_on(port, nats.url, tmp_path / "state"):
        thread.join(timeout=60)
        assert answers and not first.offline
        saved = RegistrationCache(tmp_path / "agents", "edge-1").load()
        assert saved is not None and saved.nats_url == nats.url
        assert first.retention.max_bytes == 1024**3  # the site's limits came with it
        assert (tmp_path / "agents" / "edge-1.registration.json").stat().st_mode & 0o077 == 0

    # The coordinator is gone: a restarted agent starts from what it saved, and joins
    # again once a coordinator answers.
    second = agent(port, tmp_path / "agents", offline_after=0.5)
    answer = second.register()
    assert second.offline and answer == saved and second.nats_url == nats.url
    assert second.register(once=True) is None and second.offline
    with coordinator_on(port, nats.url, tmp_path / "state"):
        assert second.register(once=True) is not None and not second.offline


def test_a_node_that_never_registered_keeps_trying_without_a_saved_registration(
    tmp_path: Path,
) -> None:
    never = agent(free_port(), tmp_path / "agents", offline_after=0.0)
    done = threading.Event()
    threading.Thread(target=lambda: (never.register(), done.set()), daemon=True).start()
    assert not done.wait(3.0)  # nothing saved: it cannot start alone, and does not give up
    assert not never.offline
