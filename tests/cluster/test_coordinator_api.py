"""The coordinator's REST API against a real NATS server (no Spark): registry, pipeline
lifecycle, placement, errors, the token, the log and restarts from NATS alone."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanflow.api.topology_loader import load_topology_text
from spanflow.control.coordinator import Coordinator, CoordinatorSettings
from spanflow.nats.server import EmbeddedNats
from spanflow.server.app import create_app
from tests.helpers import wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOPOLOGY = """
sites: [{name: edge-a, retention: {max_bytes: 64MiB, discard: old}}, {name: cloud, kind: cloud}]
nodes:
  - {name: a1, site: edge-a, streams: [{name: IN_A, subjects: ["in.a.>"]}]}
  - {name: c1, site: cloud, capabilities: {cores: 1}}
links: [{between: [edge-a, cloud], latency: 30ms}]
"""
PIPELINE = """\
name: {name}
sources:
  - {{id: src, stream: {stream}, schema: {{x: long}}, to: [out]}}
sinks:
  - {{id: out, type: jetstream, stream: OUT_{name_u}, subject: "out.{name}"}}
"""


def pipeline(name: str, stream: str = "IN_A") -> str:
    return PIPELINE.format(name=name, stream=stream, name_u=name.upper().replace("-", "_"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path / "nats") as s:
        yield s


def coordinator(
    server: EmbeddedNats, tmp_path: Path, token: str | None = TOKEN, **settings: Any
) -> Coordinator:
    return Coordinator(
        CoordinatorSettings(
            nats_url=server.url,
            state_dir=str(tmp_path / "state"),
            token=token,
            topology=load_topology_text(TOPOLOGY),
            heartbeat_interval=5.0,  # no agents here: nodes must not be failed mid-test
            **settings,
        )
    )


@pytest.fixture
def api(server: EmbeddedNats, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(coordinator(server, tmp_path))) as client:
        yield client


def register(api: TestClient, name: str, site: str, **extra: Any) -> Any:
    return api.post(
        "/api/v1/nodes",
        json={"name": name, "site": site, "agent_id": f"agent-{name}", **extra},
        headers=AUTH,
    )


def test_token_is_enforced_everywhere_but_health(api: TestClient) -> None:
    assert api.get("/healthz").status_code == 200
    for path in ("/api/v1/nodes", "/api/v1/pipelines", "/api/v1/cluster/metrics", "/metrics"):
        assert api.get(path).status_code == 401, path
        wrong = api.get(path, headers={"Authorization": "Bearer nope"})
        assert (
            wrong.status_code == 401 and wrong.json()["detail"] == "missing or wrong bearer token"
        )
        assert api.get(path, headers=AUTH).status_code == 200, path
    assert api.post("/api/v1/pipelines", json={"yaml": pipeline("p")}).status_code == 401


def test_no_token_configured_means_open(server: EmbeddedNats, tmp_path: Path) -> None:
    with TestClient(create_app(coordinator(server, tmp_path, token=None))) as client:
        assert client.get("/api/v1/nodes").status_code == 200


def test_registry_from_topology_and_registration(api: TestClient) -> None:
    nodes = {n["name"]: n for n in api.get("/api/v1/nodes", headers=AUTH).json()}
    assert {k: v["state"] for k, v in nodes.items()} == {"a1": "declared", "c1": "declared"}
    r = register(api, "a1", "edge-a", detected={"cores": 8, "memory_mb": 4096})
    assert r.status_code == 201, r.text
    a1 = api.get("/api/v1/nodes/a1", headers=AUTH).json()
    assert a1["state"] == "alive"
    assert a1["spec"]["streams"][0]["name"] == "IN_A"  # the topology's streams are kept
    assert a1["spec"]["capabilities"]["cores"] == 2  # the topology's capabilities win
    # A node the topology does not know joins its site with what it reports.
    r = register(api, "a2", "edge-a", capabilities={"cores": 4, "tags": ["gpu"]})
    assert r.status_code == 201 and r.json()["node"]["spec"]["capabilities"]["tags"] == ["gpu"]
    topo = api.get("/api/v1/topology", headers=AUTH).json()
    assert sorted(n["name"] for n in topo["nodes"]) == ["a1", "a2", "c1"]


def test_bad_requests_get_4xx_with_a_message(api: TestClient) -> None:
    r = register(api, "x1", "mars")
    assert r.status_code == 422 and "unknown site 'mars'" in r.json()["detail"]
    r = register(api, "a1", "cloud")
    assert r.status_code == 409 and "belongs to site 'edge-a'" in r.json()["detail"]
    r = register(api, "bad name!", "edge-a")
    assert r.status_code == 422
    r = api.post("/api/v1/nodes", json={"site": "edge-a"}, headers=AUTH)
    assert r.status_code == 422 and "name" in r.text
    r = api.post(
        "/api/v1/pipelines",
        json={
            "yaml": "name: p\nsources:\n  - {id: s, stream: S, to: [nowhere]}\n",
            "filename": "p.yaml",
        },
        headers=AUTH,
    )
    assert (
        r.status_code == 422
        and "p.yaml:3: sources[0].to: unknown step 'nowhere'" in r.json()["detail"]
    )
    r = api.post("/api/v1/pipelines", json={}, headers=AUTH)
    assert r.status_code == 422 and "exactly one of" in r.json()["detail"]
    r = api.post("/api/v1/pipelines", json={"spec": {"name": "p", "steps": []}}, headers=AUTH)
    assert r.status_code == 422 and "steps" in r.json()["detail"]
    r = api.post("/api/v1/pipelines", json={"yaml": pipeline("p"), "priority": -1}, headers=AUTH)
    assert r.status_code == 422
    assert api.get("/api/v1/pipelines/none", headers=AUTH).status_code == 404
    assert api.post("/api/v1/pipelines/none/cancel", headers=AUTH).status_code == 404
    assert api.post("/api/v1/nodes/none/drain", headers=AUTH).status_code == 404
    r = api.put("/api/v1/topology/links", json={"between": ["edge-a", "moon"]}, headers=AUTH)
    assert r.status_code == 422 and "unknown site 'moon'" in r.json()["detail"]


def test_lifecycle_placement_and_conflicts(api: TestClient) -> None:
    # Its input's host has not registered yet: the pipeline waits instead of going elsewhere.
    register(api, "c1", "cloud")
    r = api.post("/api/v1/pipelines", json={"yaml": pipeline("p1"), "priority": 5}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "created" and "waiting for a1" in r.json()["reason"]
    register(api, "a1", "edge-a")
    st = api.get("/api/v1/pipelines/p1", headers=AUTH).json()
    assert st["state"] == "planned"
    assert [(f["node"], f["epoch"]) for f in st["fragments"]] == [("a1", 1)]  # data locality
    assert st["latency_estimate_s"] is None and st["over_latency_budget"] is None  # no batch yet
    # A pipeline reading a stream nobody hosts goes to the least-loaded node.
    r = api.post("/api/v1/pipelines", json={"yaml": pipeline("p2", "ELSEWHERE")}, headers=AUTH)
    assert r.json()["fragments"][0]["node"] == "c1"
    # Resubmitting a live pipeline is a conflict; cancelling twice too.
    r = api.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH)
    assert r.status_code == 409 and "cancel it before resubmitting" in r.json()["detail"]
    assert api.post("/api/v1/pipelines/p1/cancel", headers=AUTH).json()["state"] == "canceled"
    r = api.post("/api/v1/pipelines/p1/cancel", headers=AUTH)
    assert r.status_code == 409 and "is canceled" in r.json()["detail"]
    r = api.post("/api/v1/pipelines/p1/savepoint", headers=AUTH)
    assert r.status_code == 409
    a1 = api.get("/api/v1/nodes/a1", headers=AUTH).json()
    assert a1["fragments"] == []
    # A canceled pipeline may be submitted again (a new run with its own checkpoints).
    again = api.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH).json()
    assert again["state"] == "planned" and again["run_id"] != st["run_id"]


def test_drain_moves_fragments_and_full_cluster_waits(api: TestClient) -> None:
    register(api, "a1", "edge-a")
    register(api, "c1", "cloud")
    api.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH)
    drained = api.post("/api/v1/nodes/a1/drain", headers=AUTH).json()
    assert drained["state"] == "draining" and drained["fragments"] == []
    st = api.get("/api/v1/pipelines/p1", headers=AUTH).json()
    assert [(f["node"], f["epoch"]) for f in st["fragments"]] == [("c1", 2)]
    # c1 has one slot (cores: 1), now used: the next pipeline waits with the reason.
    r = api.post("/api/v1/pipelines", json={"yaml": pipeline("p2", "OTHER")}, headers=AUTH).json()
    assert r["state"] == "created" and "every live node is full" in r["reason"]
    caps = api.put("/api/v1/nodes/c1/capabilities", json={"cores": 2}, headers=AUTH)
    assert caps.status_code == 200
    assert api.get("/api/v1/pipelines/p2", headers=AUTH).json()["state"] == "planned"


def test_nodes_get_their_sites_limits_and_report_streams_near_them(
    api: TestClient, server: EmbeddedNats
) -> None:
    import asyncio

    from spanflow.nats.cluster import HEARTBEAT_PREFIX
    from spanflow.nats.streams import connect
    from spanflow.protocol.messages import Heartbeat
    from spanflow.protocol.metrics import StreamUsage

    answer = register(api, "a1", "edge-a").json()
    assert answer["retention"]["max_bytes"] == 64 * 1024**2
    assert answer["retention"]["discard"] == "old"
    assert register(api, "c1", "cloud").json()["retention"]["discard"] == "new"  # the default
    usage = [
        StreamUsage(stream="IN_A", messages=10, bytes=60 * 1024**2, max_bytes=64 * 1024**2),
        StreamUsage(stream="OUT", messages=1, bytes=10, max_bytes=64 * 1024**2),
    ]
    hb = Heartbeat(node="a1", agent_id="agent-a1", seq=1, streams=usage)

    async def send() -> None:
        nc = await connect(server.url)
        await nc.publish(f"{HEARTBEAT_PREFIX}.a1", hb.model_dump_json().encode())
        await nc.flush()
        await nc.close()

    asyncio.run(send())
    wait_for(lambda: api.get("/api/v1/nodes/a1", headers=AUTH).json()["streams"] != [])
    a1 = api.get("/api/v1/nodes/a1", headers=AUTH).json()
    assert a1["warnings"] == [
        "stream IN_A is 94 % full (60.0 MiB of 64.0 MiB); when full it refuses new messages"
    ]
    text = api.get("/metrics", headers=AUTH).text
    assert 'spanflow_stream_usage_ratio{node="a1",stream="IN_A"} 0.9375' in text
    assert 'spanflow_stream_bytes{node="a1",stream="OUT"} 10.0' in text


def test_metrics_and_log(api: TestClient) -> None:
    register(api, "a1", "edge-a")
    api.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH)
    m = api.get("/api/v1/cluster/metrics", headers=AUTH).json()
    assert m["nodes"]["alive"] == 1 and m["slots"] == 2 and m["slots_used"] == 1
    assert m["utilisation"] == 0.5 and m["pipelines"]["planned"] == 1
    text = api.get("/metrics", headers=AUTH).text
    assert 'spanflow_nodes{state="alive"} 1.0' in text
    assert "spanflow_slots_used 1.0" in text
    kinds = [r["kind"] for r in api.get("/api/v1/cluster/log", headers=AUTH).json()]
    assert kinds == [
        "leader",  # the coordinator took office (epoch 1)
        "topology",
        "node-declared",  # a1 and c1, from the topology file
        "node-declared",
        "node-registered",
        "pipeline-submitted",
        "assign",
    ]
    spec = api.get("/openapi.json").json()
    assert "/api/v1/pipelines/{name}/savepoint" in spec["paths"]


def test_restart_from_nats_alone_keeps_the_view(server: EmbeddedNats, tmp_path: Path) -> None:
    with TestClient(create_app(coordinator(server, tmp_path))) as first:
        register(first, "a1", "edge-a")
        register(first, "c1", "cloud")
        first.post("/api/v1/pipelines", json={"yaml": pipeline("p1"), "priority": 7}, headers=AUTH)
        first.post("/api/v1/pipelines", json={"yaml": pipeline("p2", "X")}, headers=AUTH)
        first.post("/api/v1/pipelines/p2/cancel", headers=AUTH)
        before = _view(first)
        log_before = first.get("/api/v1/cluster/log", headers=AUTH).json()
    # A new coordinator with no topology file and no memory: only NATS.
    fresh = Coordinator(
        CoordinatorSettings(nats_url=server.url, state_dir=str(tmp_path / "state"), token=TOKEN)
    )
    with TestClient(create_app(fresh)) as second:
        assert _view(second) == before
        # Restarting appended nothing: no decision was taken again.
        assert second.get("/api/v1/cluster/log", headers=AUTH).json() == log_before


def _view(api: TestClient) -> dict[str, Any]:
    nodes = api.get("/api/v1/nodes", headers=AUTH).json()
    pipelines = api.get("/api/v1/pipelines", headers=AUTH).json()
    return {
        "nodes": {n["name"]: (n["state"], n["agent_id"], n["fragments"], n["spec"]) for n in nodes},
        "pipelines": {
            p["name"]: (
                p["state"],
                p["run_id"],
                p["priority"],
                [(f["id"], f["node"], f["epoch"]) for f in p["fragments"]],
            )
            for p in pipelines
        },
        "topology": api.get("/api/v1/topology", headers=AUTH).json(),
    }


def test_log_records_are_applied_after_a_crash_between_append_and_apply(
    server: EmbeddedNats, tmp_path: Path
) -> None:
    """A decision in the log whose KV writes never happened is applied on restart."""
    import asyncio

    from spanflow.control.log import ControlLog
    from spanflow.control.records import NodeRegistered, encode
    from spanflow.nats.cluster import WAL_PREFIX
    from spanflow.nats.streams import connect
    from spanflow.spec.cluster import NodeRecord, NodeState
    from spanflow.spec.topology import NodeSpec

    async def crash_mid_commit() -> None:
        nc = await connect(server.url)
        await ControlLog.open(nc)  # the buckets and log exist, as after a first start
        record = NodeRecord(spec=NodeSpec(name="ghost", site="edge-a"), state=NodeState.ALIVE)
        entry = NodeRegistered(at=1.0, node=record)
        await nc.jetstream().publish(f"{WAL_PREFIX}.{entry.kind}", encode(entry))
        await nc.close()  # "crash": appended, never applied

    asyncio.run(crash_mid_commit())
    c = coordinator(server, tmp_path)
    with TestClient(create_app(c)) as client:
        assert c.recovered_records == 1
        assert client.get("/api/v1/nodes/ghost", headers=AUTH).json()["state"] == "alive"


def test_savepoint_finished_while_coordinator_was_down(
    server: EmbeddedNats, tmp_path: Path
) -> None:
    """An agent's 'savepointed' report that no coordinator heard is read back from the
    activity log on start; the pipeline is STOPPED and can resume."""
    import asyncio

    from spanflow.nats.cluster import ACTIVITY_STREAM, activity_subject
    from spanflow.nats.streams import connect
    from spanflow.protocol.messages import Activity
    from spanflow.protocol.metrics import FragmentRuntime

    with TestClient(create_app(coordinator(server, tmp_path))) as first:
        register(first, "a1", "edge-a")
        first.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH)
        st = first.post("/api/v1/pipelines/p1/savepoint", headers=AUTH).json()
        assert st["state"] == "stopping"
        target = Path(st["savepoint"])
    fragment = target / "p1.f0"
    fragment.mkdir(parents=True)  # what the agent's copy of the checkpoint leaves

    async def agent_reports() -> None:
        nc = await connect(server.url)
        act = Activity(
            node="a1",
            agent_id="agent-a1",
            event="savepointed",
            runtime=FragmentRuntime(fragment_id="p1.f0", epoch=1, status="stopped"),
            savepoint_dir=str(fragment),
        )
        subject = activity_subject("a1", "p1.f0", "savepointed")
        await nc.jetstream().publish(
            subject, act.model_dump_json().encode(), stream=ACTIVITY_STREAM
        )
        await nc.close()

    asyncio.run(agent_reports())
    with TestClient(create_app(coordinator(server, tmp_path))) as second:
        st = second.get("/api/v1/pipelines/p1", headers=AUTH).json()
        assert st["state"] == "stopped" and st["savepoint"] == str(target)
        assert st["fragments"][0]["node"] is None  # unassigned while stopped
        resumed = second.post("/api/v1/pipelines/p1/resume", headers=AUTH).json()
        assert resumed["state"] == "planned"
        assert [(f["node"], f["epoch"]) for f in resumed["fragments"]] == [("a1", 2)]
        r = second.post("/api/v1/pipelines/p1/resume", headers=AUTH)
        assert r.status_code == 409 and "only a stopped pipeline resumes" in r.json()["detail"]


def test_a_pipeline_no_placement_could_fit_is_refused_with_the_reason(api: TestClient) -> None:
    register(api, "a1", "edge-a")
    tight = api.post(
        "/api/v1/pipelines",
        json={"yaml": pipeline("tight"), "latency_budget": "100ms"},
        headers=AUTH,
    )
    assert tight.status_code == 422
    detail = tight.json()["detail"]
    assert "pipeline 'tight' cannot be placed" in detail
    assert "latency budget 100 ms is 600 ms short before any network" in detail
    gpu = pipeline("gpu").replace("to: [out]}", "to: [out], node_tags: [gpu]}")
    refused = api.post("/api/v1/pipelines", json={"yaml": gpu}, headers=AUTH)
    assert refused.status_code == 422
    assert "no node at site edge-a has tags ['gpu']" in refused.json()["detail"]
    # Refused submissions leave nothing behind.
    assert api.get("/api/v1/pipelines", headers=AUTH).json() == []


def test_status_shows_each_fragment_kind_site_and_input_latency(api: TestClient) -> None:
    register(api, "a1", "edge-a")
    register(api, "c1", "cloud")
    cloud_sink = pipeline("gather").replace(
        'subject: "out.gather"}', 'subject: "out.gather", at: cloud}'
    )
    r = api.post("/api/v1/pipelines", json={"yaml": cloud_sink}, headers=AUTH)
    assert r.status_code == 201, r.text
    st = api.get("/api/v1/pipelines/gather", headers=AUTH).json()
    frags = {f["id"]: f for f in st["fragments"]}
    assert (
        frags["gather.at-edge-a"]["node"] == "a1" and frags["gather.at-edge-a"]["kind"] == "local"
    )
    glob = frags["gather.global"]
    assert glob["node"] == "c1" and glob["input_sites"] == ["edge-a"]
    assert glob["input_latency_s"] == 0.03 and glob["steps"] == ["out"]


def test_a_node_coming_back_gets_its_fragment_back_through_a_savepoint(
    server: EmbeddedNats, tmp_path: Path
) -> None:
    """Re-planning: p1 fell back to the cloud while a1 was drained; when a1 registers
    again the fragment moves home, stopping at a savepoint first (the agents' parts —
    heartbeat and 'savepointed' report — are published here as an agent would)."""

    # settle at once: the returning node is a move target on the next monitor pass
    with TestClient(create_app(coordinator(server, tmp_path, settle_heartbeats=0))) as api:
        _move_home(api, server, tmp_path)


def _move_home(api: TestClient, server: EmbeddedNats, tmp_path: Path) -> None:
    import asyncio

    from spanflow.nats.cluster import ACTIVITY_STREAM, HEARTBEAT_PREFIX, activity_subject
    from spanflow.nats.streams import connect
    from spanflow.protocol.messages import Activity, Heartbeat
    from spanflow.protocol.metrics import FragmentRuntime

    register(api, "a1", "edge-a")
    register(api, "c1", "cloud")
    api.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH)
    api.post("/api/v1/nodes/a1/drain", headers=AUTH)
    frag = api.get("/api/v1/pipelines/p1", headers=AUTH).json()["fragments"][0]
    assert (frag["node"], frag["epoch"]) == ("c1", 2)

    async def send(subject: str, body: bytes, stream: str | None = None) -> None:
        nc = await connect(server.url)
        if stream:
            await nc.jetstream().publish(subject, body, stream=stream)
        else:
            await nc.publish(subject, body)
        await nc.flush()
        await nc.close()

    running = FragmentRuntime(fragment_id="p1.f0", epoch=2, status="running")
    hb = Heartbeat(node="c1", agent_id="agent-c1", seq=1, fragments={"p1.f0": running})
    asyncio.run(send(f"{HEARTBEAT_PREFIX}.c1", hb.model_dump_json().encode()))
    wait_for(lambda: api.get("/api/v1/pipelines/p1", headers=AUTH).json()["state"] == "running")

    register(api, "a1", "edge-a", agent_id="agent-a1-restarted")  # back, and not draining

    def stopping_to_move() -> bool:
        frag = api.get("/api/v1/pipelines/p1", headers=AUTH).json()["fragments"][0]
        return (frag["node"], frag["action"]) == ("c1", "savepoint")

    wait_for(stopping_to_move, timeout=15)
    savepoint = tmp_path / "state" / "savepoints" / "moves" / "p1" / "p1.f0-e2"
    act = Activity(
        node="c1",
        agent_id="agent-c1",
        event="savepointed",
        runtime=running.model_copy(update={"status": "stopped"}),
        savepoint_dir=str(savepoint),
    )
    subject = activity_subject("c1", "p1.f0", "savepointed")
    asyncio.run(send(subject, act.model_dump_json().encode(), ACTIVITY_STREAM))

    def moved_home() -> bool:
        f = api.get("/api/v1/pipelines/p1", headers=AUTH).json()["fragments"][0]
        return (f["node"], f["epoch"], f["action"]) == ("a1", 3, "run")

    wait_for(moved_home, timeout=10)
    log = api.get("/api/v1/cluster/log?limit=1000", headers=AUTH).json()
    start = next(r for r in log if r["kind"] == "move-start")
    assert start["detail"]["node"] == "c1" and start["detail"]["to"] == "a1"
    assert "joined: at edge-a, where IN_A is born" in start["detail"]["reason"]
    assert any(r["kind"] == "move-done" and r["detail"]["fragment_epoch"] == 3 for r in log)


def test_nats_not_answering_is_a_503_clients_retry_never_a_500(
    api: TestClient, server: EmbeddedNats
) -> None:
    assert api.get("/api/v1/cluster/log", headers=AUTH).status_code == 200
    server.kill()  # a NATS server restarting, or a stream electing its leader
    answer = api.get("/api/v1/cluster/log", headers=AUTH)
    assert answer.status_code == 503
    assert answer.json()["code"] == "nats_unavailable"
    assert answer.json()["detail"].startswith("NATS did not answer")


def test_the_plan_lists_each_fragment_with_its_node_and_steps(api: TestClient) -> None:
    from spanflow.protocol.rest import FragmentPlan

    register(api, "a1", "edge-a")
    api.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH)
    answer = api.get("/api/v1/pipelines/p1/plan", headers=AUTH)
    assert answer.status_code == 200
    plan = [FragmentPlan.model_validate(f) for f in answer.json()]
    assert [(f.id, f.kind, f.site, f.node) for f in plan] == [("p1.f0", "local", "edge-a", "a1")]
    assert plan[0].steps and all("type" in step for step in plan[0].steps)
    missing = api.get("/api/v1/pipelines/nope/plan", headers=AUTH)
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]
    openapi = api.get("/openapi.json").json()
    answer_schema = openapi["paths"]["/api/v1/pipelines/{name}/plan"]["get"]["responses"]["200"]
    assert "FragmentPlan" in str(answer_schema)  # typed in the REST reference


WINDOWED = """\
name: {name}
sources:
  - {{id: src, stream: IN_A, schema: {{x: long, ts: timestamp}}, event_time: ts, to: [w]}}
processors:
  - {{id: w, type: window, tumbling: {size}, aggregates: {{n: count}}, to: [out]}}
sinks:
  - {{id: out, type: jetstream, stream: OUT_UP, subject: "out.up"}}
"""


def test_an_upgrade_is_checked_step_by_step_before_anything_stops(api: TestClient) -> None:
    register(api, "a1", "edge-a")
    body = {"yaml": WINDOWED.format(name="up", size="10s")}
    assert api.post("/api/v1/pipelines", json=body, headers=AUTH).status_code == 201
    url = "/api/v1/pipelines/up/upgrade"

    r = api.post(url, json={"yaml": WINDOWED.format(name="other", size="10s")}, headers=AUTH)
    assert (r.status_code, r.json()["code"]) == (422, "name_mismatch")
    r = api.post(url, json={"yaml": "name: up\nsources: [{id: src}]\n"}, headers=AUTH)
    assert (r.status_code, r.json()["code"]) == (422, "invalid_pipeline_file")
    assert r.json()["detail"].startswith("pipeline.yaml:2: sources[0]")  # located
    r = api.post(url, json={"yaml": WINDOWED.format(name="up", size="1m")}, headers=AUTH)
    assert (r.status_code, r.json()["code"]) == (409, "upgrade_refused")
    assert "sink 'out', step 'w': refused (size '10s' → '1m'" in r.json()["detail"]
    status = api.get("/api/v1/pipelines/up", headers=AUTH).json()
    assert status["state"] == "planned"  # untouched
    r = api.post("/api/v1/pipelines/nobody/upgrade", json=body, headers=AUTH)
    assert r.status_code in (404, 422)

    r = api.post(url, json=body, headers=AUTH)  # the same version: every step kept
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["pipeline"]["state"] == "stopping"
    assert answer["steps"] == [{"sink": "out", "step": "w", "verdict": "kept", "detail": ""}]
    r = api.post(url, json=body, headers=AUTH)
    assert (r.status_code, r.json()["code"]) == (409, "upgrade_pending")
    kinds = [e["kind"] for e in api.get("/api/v1/cluster/log", headers=AUTH).json()]
    assert kinds[-2:] == ["pipeline-savepoint", "pipeline-upgrade"]


def test_a_node_declared_over_rest_with_the_stream_brings_its_site_into_the_plan(
    api: TestClient,
) -> None:
    register(api, "a1", "edge-a")
    register(api, "c1", "cloud")
    gather = pipeline("gather").replace(
        'subject: "out.gather"}', 'subject: "out.gather", at: cloud}'
    )
    assert api.post("/api/v1/pipelines", json={"yaml": gather}, headers=AUTH).status_code == 201
    assert api.get("/api/v1/pipelines/gather", headers=AUTH).json()["sites_behind"] is None
    node = {"name": "b1", "site": "edge-b", "streams": [{"name": "IN_A", "subjects": ["in.b.>"]}]}
    r = api.put("/api/v1/topology/nodes", json=node, headers=AUTH)
    assert r.status_code == 422 and "unknown site 'edge-b'" in r.json()["detail"]
    r = api.put("/api/v1/topology/nodes", json={**node, "name": "a1"}, headers=AUTH)
    assert r.status_code == 422  # the site is checked first: edge-b is still unknown

    assert api.put("/api/v1/topology/sites", json={"name": "edge-b"}, headers=AUTH).is_success
    link = {"between": ["edge-b", "cloud"], "latency": "40ms"}
    assert api.put("/api/v1/topology/links", json=link, headers=AUTH).is_success
    r = api.put("/api/v1/topology/nodes", json={**node, "name": "a1"}, headers=AUTH)
    assert r.status_code == 409 and "belongs to site 'edge-a'" in r.json()["detail"]
    r = api.put("/api/v1/topology/nodes", json=node, headers=AUTH)
    assert r.status_code == 200, r.text
    behind = api.get("/api/v1/pipelines/gather", headers=AUTH).json()["sites_behind"]
    assert behind == {"joined": ["edge-b"], "left": [], "draining": []}
    declared = [e for e in api.get("/api/v1/cluster/log", headers=AUTH).json()]
    assert declared[-1]["kind"] == "node-declared"
