"""A real cluster on one machine: embedded NATS, the coordinator and two node agents,
each in its own process with its own SparkSession, driven through the REST API. Locked
(``up --secure``): every client below authenticates with TLS and a role's password.
Checkpoints and savepoints live in NATS (``--state-dir jetstream://…``): a fragment
moves, is killed, stops at a savepoint and resumes with nothing on any node's disk.

The tests share one cluster and run in file order: pipelines across both agents,
then a coordinator restart, then a node killed with SIGKILL (the last, as it leaves
one node).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from spanflow.errors import SpanflowError
from spanflow.local.cluster import Api, LocalCluster
from spanflow.security.secrets import ROLE_ENV, SECRETS_ENV
from tests.helpers import publish, read_records, wait_for

pytestmark = pytest.mark.slow

TOPOLOGY = """\
sites: [{name: edge-a, kind: edge}, {name: cloud, kind: cloud}]
nodes:
  - name: n1
    site: edge-a
    local: true
    capabilities: {cores: 2, slots: 4}
    streams:
      - {name: E2E_IN, subjects: ["e2ein.>"]}
      - {name: E2E_IN2, subjects: ["e2ein2.>"]}
      - {name: E2E_IN3, subjects: ["e2ein3.>"]}
      - {name: E2E_UP, subjects: ["e2eup.>"]}
  - name: n2
    site: cloud
    local: true
    capabilities: {cores: 2, slots: 4}
    streams:
      - {name: E2E_MID, subjects: ["e2emid.>"]}
links: [{between: [edge-a, cloud], latency: 20ms}]
"""


STATE = "jetstream://e2e/cluster"


def store_paths(url: str) -> list[str]:
    """Every file path in the cluster's checkpoint store (from its metadata subjects)."""
    import asyncio
    import json as jsonlib
    from urllib.parse import unquote

    from spanflow.nats.streams import connect

    async def go() -> dict[str, int]:
        nc = await connect(url)
        try:
            answer = await nc.request(
                "$JS.API.STREAM.INFO.SPANFLOW_FS_e2e",
                jsonlib.dumps({"subjects_filter": ">"}).encode(),
                timeout=5,
            )
            return dict(jsonlib.loads(answer.data)["state"].get("subjects") or {})
        finally:
            await nc.close()

    paths = []
    for subject in asyncio.run(go()):
        tokens = subject.split(".")
        if len(tokens) > 4 and tokens[3] == "M":  # $SFS.<id>.e2e.M.<segments>
            paths.append("/".join(unquote(t) for t in tokens[4:]))
    return paths


def stage(name: str, source: str, where: str, sink: str, subject: str, **extra: Any) -> str:
    options = "".join(f"\n    {k}: {v}" for k, v in extra.items())
    return f"""\
name: {name}
trigger: 0.5s
sources:
  - id: src
    stream: {source}
    schema: {{id: long, v: long}}{options}
    to: [keep]
processors:
  - {{id: keep, type: filter, where: "{where}", to: [tag]}}
  - {{id: tag, type: map, columns: {{stage: "'{name}'"}}, to: [out]}}
sinks:
  - {{id: out, type: jetstream, stream: {sink}, subject: "{subject}"}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    home = tmp_path_factory.mktemp("cluster")
    topology = home / "topology.yaml"
    topology.write_text(TOPOLOGY)
    # Locked: TLS and role users on NATS, sealed gossip, the REST token. This test
    # process is the operator, connecting as the coordinator role.
    c = LocalCluster(
        topology,
        home,
        port=0,
        token="e2e-token",
        heartbeat=0.5,
        secure=True,
        coordinator_args=["--state-dir", STATE],
    )
    assert c.secrets is not None
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(SECRETS_ENV, str(c.secrets.root))
            env.setenv(ROLE_ENV, "coordinator")
            c.start()
            assert c.nats_url.startswith("tls://")
            c.wait_for_nodes(timeout=240)
            yield c
    except BaseException:
        _dump_logs(home)
        raise
    finally:
        family = descendants(c)
        c.stop()
    # Stopping leaves no process behind: not the agents, not their Spark JVMs.
    wait_for(lambda: not [p for p in family if _alive(p)], timeout=60)


def descendants(c: LocalCluster) -> list[psutil.Process]:
    out = []
    for proc in c.procs.values():
        try:
            parent = psutil.Process(proc.pid)
            out += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _dump_logs(home: Path) -> None:
    for log in sorted((home / "logs").glob("*.log")):
        print(f"===== {log.name}\n{log.read_text(errors='replace')[-4000:]}")


def submit(api: Api, text: str, **options: Any) -> dict[str, Any]:
    return api.call("POST", "/api/v1/pipelines", {"yaml": text, **options})


def pipeline(api: Api, name: str) -> dict[str, Any]:
    return api.call("GET", f"/api/v1/pipelines/{name}")


def records(n: int, start: int = 0) -> list[dict[str, int]]:
    return [{"id": i, "v": i} for i in range(start, start + n)]


def ids(url: str, stream: str) -> Counter[int]:
    return Counter(r["id"] for r in read_records(url, stream))


def test_pipelines_run_across_two_agents_and_cancel(cluster: LocalCluster) -> None:
    api, url = cluster.api(), cluster.nats_url
    publish(url, "E2E_IN", "e2ein.x", records(400))
    submit(
        api,
        stage("edge-stage", "E2E_IN", "v % 2 = 0", "E2E_MID", "e2emid.x"),
        latency_budget="60s",
        parallelism=2,
    )
    submit(api, stage("cloud-stage", "E2E_MID", "v % 4 = 0", "E2E_OUT", "e2eout.x"))
    placed = {p: pipeline(api, p)["fragments"][0]["node"] for p in ("edge-stage", "cloud-stage")}
    assert placed == {"edge-stage": "n1", "cloud-stage": "n2"}  # each next to its input
    wait_for(lambda: all(pipeline(api, p)["state"] == "running" for p in placed), timeout=120)
    wait_for(lambda: sum(ids(url, "E2E_OUT").values()) >= 100, timeout=120)
    out = ids(url, "E2E_OUT")
    assert out == Counter(range(0, 400, 4))  # every expected record, once
    # Progress reaches the coordinator through heartbeats, a moment after the output.
    wait_for(lambda: api.call("GET", "/api/v1/pipelines/edge-stage/metrics")["rows_in"] >= 400)
    metrics = api.call("GET", "/api/v1/pipelines/edge-stage/metrics")
    assert metrics["rows_in"] == 400 and metrics["state"] == "running"
    edge = pipeline(api, "edge-stage")
    assert edge["parallelism"] == 2 and edge["latency_budget"] == 60.0
    assert 0 < edge["latency_estimate_s"] < 60 and edge["over_latency_budget"] is False
    assert api.call("GET", "/api/v1/cluster/metrics")["slots_used"] == 2

    for p in placed:
        assert api.call("POST", f"/api/v1/pipelines/{p}/cancel")["state"] == "canceled"
    # The agents stop the queries: their heartbeats list no fragments any more.
    wait_for(lambda: all(not n["running"] for n in api.call("GET", "/api/v1/nodes")), timeout=60)
    kinds = [r["kind"] for r in api.call("GET", "/api/v1/cluster/log?limit=1000")]
    assert kinds.count("pipeline-canceled") == 2


def test_coordinator_restart_keeps_state_and_running_queries(cluster: LocalCluster) -> None:
    api, url = cluster.api(), cluster.nats_url
    publish(url, "E2E_IN2", "e2ein2.x", records(200))
    submit(api, stage("steady", "E2E_IN2", "v >= 0", "E2E_STEADY", "e2esteady.x"))
    wait_for(lambda: pipeline(api, "steady")["state"] == "running", timeout=120)
    wait_for(lambda: sum(ids(url, "E2E_STEADY").values()) == 200, timeout=120)
    before = view(api)
    runtime = agent_runtime(api, "n1", "steady.f0")
    log_before = api.call("GET", "/api/v1/cluster/log?limit=1000")

    cluster.kill("coordinator")
    publish(url, "E2E_IN2", "e2ein2.x", records(200, start=200))  # flows while it is down
    wait_for(lambda: sum(ids(url, "E2E_STEADY").values()) == 400, timeout=120)
    cluster.start_coordinator()
    api = cluster.api()

    assert view(api) == before  # same registry, pipelines and assignments
    wait_for(lambda: agent_runtime(api, "n1", "steady.f0") is not None, timeout=30)
    after = agent_runtime(api, "n1", "steady.f0")
    assert after is not None and runtime is not None
    assert after["started_at"] == runtime["started_at"]  # the fragment was not restarted
    assert after["queries"] == runtime["queries"]  # same Spark run ids
    assert after["epoch"] == runtime["epoch"]
    new = api.call("GET", "/api/v1/cluster/log?limit=1000")[len(log_before) :]
    assert [r["kind"] for r in new if r["kind"] in ("assign", "unassign", "node-failed")] == []
    publish(url, "E2E_IN2", "e2ein2.x", records(100, start=400))
    wait_for(lambda: sum(ids(url, "E2E_STEADY").values()) == 500, timeout=120)
    assert ids(url, "E2E_STEADY") == Counter(range(500))
    assert pipeline(api, "steady")["state"] == "running"


def test_savepoint_and_resume_continue_exactly_once(cluster: LocalCluster) -> None:
    api, url = cluster.api(), cluster.nats_url
    st = api.call("POST", "/api/v1/pipelines/steady/savepoint")
    assert st["state"] == "stopping"
    wait_for(lambda: pipeline(api, "steady")["state"] == "stopped", timeout=60)
    savepoint = pipeline(api, "steady")["savepoint"]
    assert savepoint.startswith(f"{STATE}/savepoints/steady/")
    saved = savepoint.removeprefix("jetstream://e2e/") + "/steady.f0/steady/out/offsets/"
    assert any(p.startswith(saved) for p in store_paths(url))
    # nothing of it on a disk: the checkpoints and the savepoint are in NATS
    assert not list((cluster.data_dir).rglob("offsets"))
    wait_for(lambda: not agent_runtime_running(api, "n1", "steady.f0"), timeout=30)
    publish(url, "E2E_IN2", "e2ein2.x", records(100, start=500))  # arrives while stopped
    assert api.call("POST", "/api/v1/pipelines/steady/resume")["state"] in ("planned", "running")
    wait_for(lambda: pipeline(api, "steady")["state"] == "running", timeout=120)
    wait_for(lambda: sum(ids(url, "E2E_STEADY").values()) >= 600, timeout=120)
    assert ids(url, "E2E_STEADY") == Counter(range(600))  # resumed where it stopped
    epochs = [f["epoch"] for f in pipeline(api, "steady")["fragments"]]
    assert epochs == [2]

    from typer.testing import CliRunner

    from spanflow.cli import app

    result = CliRunner().invoke(
        app, ["status", "--coordinator", cluster.url, "--token", "e2e-token"], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    for name in ("n1", "n2", "edge-stage", "cloud-stage", "steady", "canceled", "running"):
        assert name in result.output
    denied = CliRunner().invoke(app, ["status", "--coordinator", cluster.url, "--token", "bad"])
    assert denied.exit_code == 2 and "401" in denied.output
    api.call("POST", "/api/v1/pipelines/steady/cancel")


def windowed(size: str, *, copy: bool = False) -> str:
    """A pipeline of 10-second windows over event time; ``copy``: one more sink, the
    records as they come."""
    to = "[per_10s, raw]" if copy else "[per_10s]"
    raw = '\n  - {id: raw, type: filter, where: "id >= 0", to: [copy]}' if copy else ""
    sink = '\n  - {id: copy, type: jetstream, stream: E2E_UPC, subject: "e2eupc.x"}' if copy else ""
    return f"""\
name: upgraded
trigger: 0.5s
sources:
  - id: src
    stream: E2E_UP
    schema: {{id: long, ts: timestamp}}
    event_time: ts
    to: {to}
processors:
  - id: per_10s
    type: window
    tumbling: {size}
    aggregates: {{n: count, ids: "sum(id)"}}
    to: [out]{raw}
sinks:
  - {{id: out, type: jetstream, stream: E2E_UPW, subject: "e2eupw.x"}}{sink}
"""


def test_an_upgrade_keeps_window_state_and_survives_a_coordinator_kill(
    cluster: LocalCluster,
) -> None:
    """A window open across the upgrade counts the records of both versions; a version
    that would change the window is refused while the old one runs on; the coordinator
    killed with SIGKILL while the old version takes its savepoint finishes the upgrade
    from the control log when it is back."""
    from datetime import UTC, datetime

    api, url = cluster.api(), cluster.nats_url

    def at(second: float) -> str:
        return datetime.fromtimestamp(1_800_000_000 + second, UTC).isoformat()

    publish(url, "E2E_UP", "e2eup.x", [{"id": i, "ts": at(i * 0.1)} for i in range(50)])
    submit(api, windowed("10s"))
    wait_for(lambda: pipeline(api, "upgraded")["state"] == "running", timeout=120)
    metrics = "/api/v1/pipelines/upgraded/metrics"
    wait_for(lambda: api.call("GET", metrics)["rows_in"] >= 50, timeout=120)

    with pytest.raises(
        SpanflowError, match=r"(?s)409: .*step 'per_10s': refused .*size '10s' → '1m'"
    ):
        api.call("POST", "/api/v1/pipelines/upgraded/upgrade", {"yaml": windowed("1m")})
    assert pipeline(api, "upgraded")["state"] == "running"

    answer = api.call(
        "POST", "/api/v1/pipelines/upgraded/upgrade", {"yaml": windowed("10s", copy=True)}
    )
    assert answer["pipeline"]["state"] == "stopping"
    verdicts = {(s["sink"], s["step"]): s["verdict"] for s in answer["steps"]}
    assert verdicts == {("out", "per_10s"): "kept"}
    cluster.kill("coordinator")  # while the savepoint is being taken
    cluster.start_coordinator()
    api = cluster.api()

    def upgraded() -> bool:
        p = pipeline(api, "upgraded")
        return p["state"] == "running" and [f["epoch"] for f in p["fragments"]] == [2]

    wait_for(upgraded, timeout=180)
    assert "copy" in {s["id"] for s in api.call("GET", "/api/v1/pipelines/upgraded/spec")["steps"]}
    more = [{"id": i, "ts": at(5 + (i - 50) * 0.1)} for i in range(50, 60)]
    publish(url, "E2E_UP", "e2eup.x", [*more, {"id": 1000, "ts": at(25)}])
    wait_for(lambda: read_records(url, "E2E_UPW"), timeout=120)
    (window,) = read_records(url, "E2E_UPW")
    assert (window["n"], window["ids"]) == (60, sum(range(60)))  # both versions' records
    # the added sink started empty, and read the stream from its start
    wait_for(lambda: sum(ids(url, "E2E_UPC").values()) >= 61, timeout=120)
    assert ids(url, "E2E_UPC") == Counter([*range(60), 1000])
    kinds = [r["kind"] for r in api.call("GET", "/api/v1/cluster/log?limit=1000")]
    assert kinds.count("pipeline-upgrade") == 1 and kinds.count("pipeline-upgraded") == 1
    api.call("POST", "/api/v1/pipelines/upgraded/cancel")


def agent_runtime_running(api: Api, node: str, fragment: str) -> bool:
    return fragment in api.call("GET", f"/api/v1/nodes/{node}")["running"]


def view(api: Api) -> dict[str, Any]:
    nodes = api.call("GET", "/api/v1/nodes")
    pipelines = api.call("GET", "/api/v1/pipelines")
    return {
        "nodes": {n["name"]: (n["state"], n["agent_id"], n["fragments"], n["spec"]) for n in nodes},
        "pipelines": {
            p["name"]: (
                p["state"],
                p["run_id"],
                [(f["id"], f["node"], f["epoch"]) for f in p["fragments"]],
            )
            for p in pipelines
        },
        "topology": api.call("GET", "/api/v1/topology"),
    }


def agent_runtime(api: Api, node: str, fragment: str) -> dict[str, Any] | None:
    rt: dict[str, Any] | None = api.call("GET", f"/api/v1/nodes/{node}")["agent_fragments"].get(
        fragment
    )
    return rt


def test_killed_node_fragments_move_and_output_stays_exactly_once(cluster: LocalCluster) -> None:
    api, url = cluster.api(), cluster.nats_url
    total = 3000
    publish(url, "E2E_IN3", "e2ein3.x", records(total))
    submit(
        api,
        stage("survivor", "E2E_IN3", "v % 3 != 0", "E2E_SURV", "e2esurv.x", max_rows_per_batch=60),
    )
    assert pipeline(api, "survivor")["fragments"][0]["node"] == "n1"
    expected = Counter(i for i in range(total) if i % 3 != 0)
    wait_for(lambda: sum(ids(url, "E2E_SURV").values()) >= 200, timeout=120)
    assert sum(ids(url, "E2E_SURV").values()) < len(expected), "finished before the kill"

    n1_family = psutil.Process(cluster.procs["node-n1"].pid).children(recursive=True)
    assert any("java" in p.name() for p in n1_family)  # its Spark JVM
    cluster.kill("node-n1")  # SIGKILL: no goodbye, mid-stream
    killed_at = time.monotonic()
    wait_for(lambda: pipeline(api, "survivor")["fragments"][0]["node"] == "n2", timeout=60)
    moved = pipeline(api, "survivor")["fragments"][0]
    assert moved["epoch"] == 2
    nodes = {n["name"]: n["state"] for n in api.call("GET", "/api/v1/nodes")}
    assert nodes["n1"] == "failed"
    wait_for(lambda: sum(ids(url, "E2E_SURV").values()) >= len(expected), timeout=180)
    assert ids(url, "E2E_SURV") == expected  # nothing lost, nothing twice
    wait_for(lambda: pipeline(api, "survivor")["state"] == "running", timeout=60)
    kinds = [r["kind"] for r in api.call("GET", "/api/v1/cluster/log?limit=1000")]
    assert "node-failed" in kinds and kinds.count("unassign") >= 1
    print(f"fragment moved and caught up {time.monotonic() - killed_at:.1f} s after the kill")
    # The dead agent's Spark JVM goes with it (it exits when its driver's pipe closes).
    wait_for(lambda: not [p for p in n1_family if _alive(p)], timeout=30)

    # n1 comes back: re-planning moves the fragment home (it was 20 ms from its data),
    # through a savepoint, so its state and the exactly-once output survive the move.
    cluster.start_node("n1")
    wait_for(lambda: pipeline(api, "survivor")["fragments"][0]["node"] == "n1", timeout=240)
    home = pipeline(api, "survivor")["fragments"][0]
    assert home["epoch"] == 3
    more = 600
    publish(url, "E2E_IN3", "e2ein3.x", records(more, start=total))
    expected.update(i for i in range(total, total + more) if i % 3 != 0)
    wait_for(lambda: sum(ids(url, "E2E_SURV").values()) >= sum(expected.values()), timeout=240)
    assert ids(url, "E2E_SURV") == expected
    kinds = [r["kind"] for r in api.call("GET", "/api/v1/cluster/log?limit=1000")]
    assert "move-start" in kinds and "move-done" in kinds


def test_no_secret_shows_in_logs_status_api_or_metrics(cluster: LocalCluster) -> None:
    """Passwords, the REST token and gossip keys stay in the secrets directory: not in
    any process's log, not in what the API or /metrics answer."""
    assert cluster.secrets is not None
    creds = cluster.secrets.credentials()
    secrets = [*creds.passwords.values(), creds.rest_token]
    secrets += [line.strip() for line in cluster.secrets.keyring_file.read_text().splitlines()]
    api = cluster.api()
    seen = [
        json.dumps(api.call("GET", path))
        for path in ("/api/v1/nodes", "/api/v1/pipelines", "/api/v1/cluster/log?limit=1000")
    ]
    seen.append(api.client.request("GET", "/metrics").text)
    seen += [p.read_text(errors="replace") for p in (cluster.data_dir / "logs").glob("*.log")]
    assert len(seen) > 5
    for text in seen:
        for secret in secrets:
            assert secret not in text


def test_a_forged_gossip_packet_is_dropped_and_counted(cluster: LocalCluster) -> None:
    """Gossip is sealed: a plain packet sent to a node's membership port is dropped and
    counted, in the node's status and in /metrics."""
    api = cluster.api()
    node = api.call("GET", "/api/v1/nodes/n2")
    host, port = str(node["gossip_addr"]).rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.sendto(b'[["alive", "forger", 9, "127.0.0.1:9"]]', (host, int(port)))
    wait_for(lambda: api.call("GET", "/api/v1/nodes/n2")["gossip_rejected"] >= 1, timeout=30)
    metrics = api.client.request("GET", "/metrics").text
    assert re.search(r'spanflow_gossip_rejected_packets_total\{node="n2"\} [1-9]', metrics)
    assert "forger" not in json.dumps(api.call("GET", "/api/v1/nodes"))
