"""Node reports sealed by their own node: every agent logs in to NATS as the shared
``agent`` user (and reports from a site cross its leaf link, where the hub cannot tell
one client from another), so a host holding one agent's bundle could publish
heartbeats and activity for any node. A locked coordinator counts only reports sealed
with the sending node's token (security/node_seal.py). Here the holder of node a1's
bundle tries to keep node a2 — registered, its agent gone — alive: a2 fails anyway;
a2's own sealed beats bring it back (so the path the attack takes does work)."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from spanflow.control.coordinator import Coordinator, CoordinatorSettings
from spanflow.nats.cluster import HEARTBEAT_PREFIX, activity_subject
from spanflow.nats.streams import connect
from spanflow.protocol.messages import Activity, Heartbeat
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.security.node_seal import ReportGate, seal, seal_headers
from spanflow.security.secrets import Secrets, node_token
from tests.security.coordinators import coordinator_api

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

TOPOLOGY = """
sites:
  - {name: edge-a}
nodes:
  - {name: a1, site: edge-a}
  - {name: a2, site: edge-a}
"""
SUBJECT = f"{HEARTBEAT_PREFIX}.a2"


def _beat(agent: str, seq: int, at: float | None = None) -> bytes:
    hb = Heartbeat(node="a2", agent_id=agent, seq=seq)
    return (hb if at is None else hb.model_copy(update={"at": at})).model_dump_json().encode()


# -- the gate (pure) --------------------------------------------------------------------------
def test_only_a_report_sealed_by_its_own_node_counts() -> None:
    gate, now = ReportGate("key"), time.time()
    data = _beat("x", 1, now)
    mine, theirs = node_token("key", "a2"), node_token("key", "a1")
    assert gate.refusal("a2", SUBJECT, data, None, now, now) is not None
    assert "another host" in (
        gate.refusal("a2", SUBJECT, data, seal(theirs, SUBJECT, data), now, now) or ""
    )
    assert gate.refusal("a2", SUBJECT, data, seal(mine, SUBJECT, data), now, now) is None
    # the seal covers the subject and the body: neither can be swapped under it
    assert gate.refusal("a2", SUBJECT, data + b" ", seal(mine, SUBJECT, data), now, now)
    other = f"{HEARTBEAT_PREFIX}.a1"
    assert gate.refusal("a2", other, data, seal(mine, SUBJECT, data), now, now)
    assert ReportGate(None).refusal("a2", SUBJECT, data, None, now, now) is None  # open cluster


def test_a_captured_heartbeat_replayed_does_not_count() -> None:
    gate, now, token = ReportGate("key"), time.time(), node_token("key", "a2")

    def beat(agent: str, seq: int, at: float) -> str | None:
        data = _beat(agent, seq, at)
        sealed = seal(token, SUBJECT, data)
        return gate.heartbeat_refusal("a2", SUBJECT, data, sealed, (agent, seq, at), now)

    assert beat("x", 1, now - 5) is None
    assert beat("x", 2, now - 4) is None
    assert beat("x", 2, now - 4) is not None  # the same beat again
    assert beat("x", 1, now - 5) is not None  # an older one
    assert beat("y", 1, now - 3) is None  # the agent restarted: a later start counts
    assert beat("x", 3, now - 3.5) is not None  # the dead agent's beats no longer do
    assert "off this coordinator's clock" in (beat("z", 1, now - 3600) or "")


def test_a_flood_of_refusals_is_logged_once_a_minute_per_node_for_few_names() -> None:
    gate = ReportGate("key")
    assert gate.worth_logging("a2", 0.0) and not gate.worth_logging("a2", 30.0)
    assert gate.worth_logging("a2", 61.0)
    logged = sum(gate.worth_logging(f"made-up-{i}", 0.0) for i in range(1000))
    assert logged == 255  # a2 took one of the 256 names remembered


# -- a locked coordinator, the holder of a1's bundle, real NATS ----------------------------------
@pytest.fixture
def full(tmp_path: Path) -> Secrets:
    found = Secrets(tmp_path / "full")
    found.init()
    return found


@pytest.fixture
def api(full: Secrets, tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    with coordinator_api(full, tmp_path, TOPOLOGY, heartbeat_interval=0.5) as found:
        yield found


def _state(api: TestClient, token: str, node: str) -> str:
    nodes = api.get("/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}).json()
    return next(n["state"] for n in nodes if n["spec"]["name"] == node)


def _until_state(api: TestClient, token: str, node: str, wanted: str, within: float) -> None:
    deadline = time.monotonic() + within
    while _state(api, token, node) != wanted:
        assert time.monotonic() < deadline, f"{node} never turned {wanted}"
        time.sleep(0.1)


class _Beats:
    """Heartbeats for a2 every 0.1 s from a thread, sealed with ``token`` (None: bare)."""

    def __init__(self, url: str, token: str | None, agent: str) -> None:
        self.url, self.token, self.agent = url, token, agent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        nc = await connect(self.url)
        seq = 0
        while not self._stop.is_set():
            seq += 1
            data = _beat(self.agent, seq)
            await nc.publish(SUBJECT, data, headers=seal_headers(self.token, SUBJECT, data))
            await asyncio.sleep(0.1)
        await nc.close()

    def __enter__(self) -> _Beats:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_one_agents_bundle_cannot_keep_another_node_alive(
    api: tuple[TestClient, str], full: Secrets, tmp_path: Path
) -> None:
    client, url = api
    operator = full.credentials().rest_token
    assert operator is not None
    full.export(tmp_path / "a1", "agent", node="a1")
    stolen = Secrets(tmp_path / "a1").credentials().node_tokens["a1"]
    body = {"name": "a2", "site": "edge-a", "agent_id": "agent-a2"}
    headers = {"Authorization": f"Bearer {operator}"}
    assert client.post("/api/v1/nodes", json=body, headers=headers).status_code == 201
    assert _state(client, operator, "a2") == "alive"
    # a2's agent is gone; a1's host beats for it, bare and under a1's own seal
    with _Beats(url, None, "agent-a2"), _Beats(url, stolen, "agent-a2"):
        _until_state(client, operator, "a2", "failed", within=15)
        time.sleep(1.0)  # beats keep coming: a2 stays failed
        assert _state(client, operator, "a2") == "failed"
    a2 = node_token(full.credentials().agent_key or "", "a2")
    with _Beats(url, a2, "agent-a2"):  # the node's own token: heard again
        _until_state(client, operator, "a2", "alive", within=15)


def test_activity_sealed_by_another_node_is_not_taken(full: Secrets, tmp_path: Path) -> None:
    """What the coordinator's activity subscription (and its read of stored savepoint
    reports) does with a report: only its own node's seal counts."""
    key = full.credentials().agent_key or ""
    settings = CoordinatorSettings(nats_url="nats://unused:1", node_token_key=key)
    coordinator = Coordinator(settings)
    rt = FragmentRuntime(fragment_id="p-f0", epoch=1, status="failed")
    act = Activity(node="a2", agent_id="agent-a2", event="failed", runtime=rt)
    subject, data = activity_subject("a2", "p-f0", "failed"), act.model_dump_json().encode()

    class Msg:  # what a subscription hands the coordinator
        def __init__(self, token: str | None) -> None:
            self.subject, self.data = subject, data
            self.headers = seal_headers(token, subject, data)

    for token, counts in (
        (None, False),
        (node_token(key, "a1"), False),
        (node_token(key, "a2"), True),
    ):
        assert coordinator.node_reports._sealed_by_node(Msg(token), "a2", act.at) is counts  # type: ignore[arg-type]
