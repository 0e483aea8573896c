"""Three coordinators over a three-server NATS cluster (``spanflow up --ha`` without
nodes): one leads, standbys answer reads and redirect writes, a SIGKILLed leader is
replaced within seconds with nothing lost, a killed NATS server is survived, and a
restarted replica comes back as a standby with the whole state."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from spanflow.control.leadership import LEASE_KEY, RENEWALS_PER_LEASE, Lease, lease_for
from spanflow.errors import SpanflowError
from spanflow.local.cluster import Api, LocalCluster
from spanflow.nats.cluster import LEADER_BUCKET
from spanflow.nats.streams import SyncNats
from spanflow.protocol.rest import LogEntry
from spanflow.testing.heartbeats import Heartbeats
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

TOPOLOGY = """\
sites: [{name: edge-a}, {name: cloud, kind: cloud}]
nodes:
  - {name: a1, site: edge-a, streams: [{name: HA_IN, subjects: ["hain.>"]}]}
  - {name: c1, site: cloud}
links: [{between: [edge-a, cloud], latency: 20ms}]
"""

PIPELINE = """\
name: {name}
sources:
  - {{id: src, stream: HA_IN, schema: {{x: long}}, to: [out]}}
sinks:
  - {{id: out, type: jetstream, stream: HA_OUT_{upper}, subject: "haout.{name}"}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("ha")
    topology = root / "topology.yaml"
    topology.write_text(TOPOLOGY)
    c = LocalCluster(topology, root / "data", port=0, ha=True, heartbeat=0.5)
    beats: Heartbeats | None = None
    try:
        c.start()
        wait_for(lambda: c.leader() is not None, timeout=30)
        beats = Heartbeats(c.nats_url)
        c.heartbeats = beats  # type: ignore[attr-defined]
        yield c
    finally:
        if beats is not None:
            beats.stop()
        c.stop()


def register(api: Api, name: str, site: str, agent: str, cluster: LocalCluster) -> dict[str, Any]:
    body = {"name": name, "site": site, "agent_id": agent}
    answer = dict(api.call("POST", "/api/v1/nodes", body))
    cluster.heartbeats.agents[name] = agent  # type: ignore[attr-defined]
    return answer


def submit(api: Api, name: str) -> dict[str, Any]:
    text = PIPELINE.format(name=name, upper=name.upper())
    return dict(api.call("POST", "/api/v1/pipelines", {"yaml": text}))


def view(api: Api) -> dict[str, Any]:
    nodes = api.call("GET", "/api/v1/nodes")
    pipelines = api.call("GET", "/api/v1/pipelines")
    return {
        "nodes": {n["name"]: (n["state"], n["agent_id"]) for n in nodes},
        "pipelines": {
            p["name"]: (
                p["state"],
                p["run_id"],
                [(f["id"], f["node"], f["epoch"]) for f in p["fragments"]],
            )
            for p in pipelines
        },
    }


def standby(cluster: LocalCluster) -> str:
    leader = cluster.leader()
    return next(n for n in cluster.coordinators if n != leader and cluster.procs[n].poll() is None)


def test_one_leader_standbys_read_and_redirect_writes(cluster: LocalCluster) -> None:
    roles = {
        n: httpx.get(f"{cluster.coordinator_urls[n]}/healthz").json()["role"]
        for n in cluster.coordinators
    }
    assert sorted(roles.values()) == ["leader", "standby", "standby"]
    other = Api(cluster.coordinator_urls[standby(cluster)], None)
    register(other, "a1", "edge-a", "agent-a1", cluster)  # a write to a standby reaches the leader
    assert submit(other, "p1")["state"] == "planned"
    # Every replica has it (standbys tail the log).
    for name in cluster.coordinators:
        one = Api(cluster.coordinator_urls[name], None)
        wait_for(lambda one=one: "p1" in view(one)["pipelines"], timeout=10)
        assert view(one) == view(cluster.api())
    log = cluster.api().call("GET", "/api/v1/cluster/log?limit=1000")
    assert [r["kind"] for r in log].count("leader") == 1 and log[0]["epoch"] == 1


def test_a_model_promote_at_a_standby_is_redirected_to_the_leader_and_logged(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The model registry is written by the leader only: a standby answers a push or a
    promote with a redirect to the leader (307, nothing written by it), and each change
    the leader makes is a record of the control log, which every replica then holds."""
    from tests.cep.test_rule_sets import RULE_FILE
    from tests.ml.test_model_registry import _onnx_model

    data = _onnx_model(tmp_path / "m.onnx").read_bytes()
    other = Api(cluster.coordinator_urls[standby(cluster)], None)
    headers = other.client.headers
    push = f"{other.url}/api/v1/models/ha-model/versions?format=onnx&features=t,v"
    promote = f"{other.url}/api/v1/models/ha-model/promote"
    leader_url = cluster.coordinator_urls[cluster.leader() or ""]
    # A standby redirects once it has read the leader's lease (at once, in a running
    # cluster; this test may run first, right after the start).
    wait_for(lambda: other.call("GET", "/api/v1/cluster")["leader_url"] == leader_url, timeout=15)
    for r in (
        httpx.post(push, content=data, headers=headers),
        httpx.post(promote, json={"version": 1}, headers=headers),
    ):
        assert r.status_code == 307 and r.headers["location"].startswith(leader_url), r.text
    pushed = httpx.post(push, content=data, headers=headers, follow_redirects=True)
    assert pushed.status_code == 201 and pushed.json()["version"] == 1
    promoted = httpx.post(promote, json={"version": 1}, headers=headers, follow_redirects=True)
    assert promoted.status_code == 200 and promoted.json()["production"] == 1

    def changes(api: Api) -> list[tuple[str, int]]:
        log = api.call("GET", "/api/v1/cluster/log?limit=1000")
        return [
            (e["detail"]["action"], e["detail"]["version"])
            for e in log
            if e["kind"] == "catalog-changed" and e["detail"]["name"] == "ha-model"
        ]

    wait_for(lambda: changes(other) == [("push", 1), ("promote", 1)], timeout=10)
    assert changes(cluster.api()) == [("push", 1), ("promote", 1)]

    # The CLI with --coordinator goes the same way: to a standby, redirected, logged.
    from typer.testing import CliRunner

    from spanflow.cli import app

    model = tmp_path / "m.onnx"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE_FILE)
    at = ["--coordinator", other.url]
    for args in (
        ["model", "push", str(model), "--name", "ha-model", "--features", "t,v", *at],
        ["model", "promote", "ha-model", "2", *at],
        ["model", "rollback", "ha-model", *at],
        ["rules", "push", str(rules), "--name", "ha-rules", *at],
    ):
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    wait_for(lambda: len(changes(cluster.api())) == 5, timeout=10)
    assert changes(cluster.api())[2:] == [("push", 2), ("promote", 2), ("rollback", 1)]
    log = cluster.api().call("GET", "/api/v1/cluster/log?limit=1000")
    assert [
        (e["detail"]["name"], e["detail"]["action"])
        for e in log
        if e["kind"] == "catalog-changed" and e["detail"]["catalog"] == "rules"
    ] == [("ha-rules", "push")]
    # Reads through REST too: what the CLI lists is what the leader wrote.
    listed = CliRunner().invoke(app, ["model", "list", *at], catch_exceptions=False)
    assert listed.exit_code == 0 and "ha-model" in listed.output, listed.output
    assert listed.output.count("production") == 1 and listed.output.count("archived") == 1
    one = CliRunner().invoke(app, ["rules", "list", "ha-rules", *at], catch_exceptions=False)
    assert one.exit_code == 0 and "ha-rules" in one.output and "yes" in one.output, one.output


@pytest.mark.solo  # a bound on the election after the kill
def test_killed_leader_is_replaced_and_nothing_is_lost(cluster: LocalCluster) -> None:
    api = cluster.api()
    before = view(api)
    old = cluster.leader()
    assert old is not None
    cluster.kill(old)
    killed = time.monotonic()
    # Writes through the URL list go on: the client waits out the election.
    register(api, "c1", "cloud", "agent-c1", cluster)
    took = time.monotonic() - killed
    new = cluster.leader()
    assert new is not None and new != old
    # The lease outlives JetStream's own failover (17 s on a cluster, see
    # leadership.lease_for); a standby checks it every third of that.
    bound = lease_for(3) * (1 + 1 / RENEWALS_PER_LEASE) + 5
    assert took < bound, f"a new leader accepted a write {took:.1f} s after the kill"
    after = view(api)
    assert after["pipelines"] == before["pipelines"]
    assert after["nodes"]["a1"] == before["nodes"]["a1"] and after["nodes"]["c1"][0] == "alive"
    epochs = [r["epoch"] for r in api.call("GET", "/api/v1/cluster/log?limit=1000")]
    assert epochs == sorted(epochs) and epochs[-1] == 2  # the new leader's epoch
    # The killed replica comes back as a standby with the whole state.
    cluster.start_coordinator(old)
    back = Api(cluster.coordinator_urls[old], None)
    assert httpx.get(f"{cluster.coordinator_urls[old]}/healthz").json()["role"] == "standby"
    wait_for(lambda: view(back) == view(api), timeout=10)


def test_the_control_plane_survives_a_nats_server_kill(cluster: LocalCluster) -> None:
    api = cluster.api()
    nats = cluster._nats
    victim = 0
    nats.servers[victim].kill()
    try:
        assert submit(api, "p2")["state"] == "planned"
        wait_for(lambda: cluster.leader() is not None, timeout=15)
        assert "p2" in view(api)["pipelines"]
    finally:
        nats.restart(victim)


def _lease_and_bucket_leader(cluster: LocalCluster) -> tuple[Lease, int, str | None]:
    """The lease, its revision, and the NATS server leading the lease bucket's Raft group."""
    client = SyncNats(cluster.nats_url)
    try:

        async def read() -> tuple[Lease, int, str | None]:
            kv = await client.js.key_value(LEADER_BUCKET)
            entry = await kv.get(LEASE_KEY)
            info = await client.js.stream_info(f"KV_{LEADER_BUCKET}")
            leader = info.cluster.leader if info.cluster is not None else None
            return Lease.model_validate_json(entry.value or b""), entry.revision or 0, leader

        return client.run(read, timeout=10)
    finally:
        client.close()


def _lease_when_readable(cluster: LocalCluster) -> tuple[Lease, int, str | None]:
    """The lease once the bucket answers (a server the previous test restarted may
    still be catching up)."""
    found: list[tuple[Lease, int, str | None]] = []

    def readable() -> bool:
        try:
            found.append(_lease_and_bucket_leader(cluster))
        except Exception:
            return False
        return found[-1][2] is not None

    wait_for(readable, timeout=60, interval=0.5)
    return found[-1]


def _leader_records(api: Api) -> list[LogEntry]:
    """The control log's ``leader`` records, once a coordinator can read the log (503
    while a server the previous test restarted catches up is an answer to wait out)."""
    found: list[list[LogEntry]] = []

    def readable() -> bool:
        try:
            found.append(api.typed(lambda c: c.log(limit=1000)))
        except SpanflowError as exc:
            if not str(exc).startswith(("503", "no coordinator answered")):
                raise
            return False
        return True

    wait_for(readable, timeout=60, interval=0.5)
    return [r for r in found[-1] if r.kind == "leader"]


def test_killing_the_nats_server_that_leads_the_lease_bucket_keeps_the_leader(
    cluster: LocalCluster,
) -> None:
    """The worst NATS server to lose: the one leading the lease bucket. The bucket has no
    leader for up to ~11 s; the lease (19 s) outlives that and the leader's retries, so
    the coordinator that led still leads once the bucket answers again, with no new
    epoch."""
    api = cluster.api()
    wait_for(lambda: cluster.leader() is not None, timeout=30)
    leader = cluster.leader()
    leaders_before = _leader_records(api)
    lease, revision, bucket_leader = _lease_when_readable(cluster)
    assert lease.holder == leader and bucket_leader is not None
    victim = int(bucket_leader.rsplit("-", 1)[1]) - 1
    nats = cluster._nats
    nats.servers[victim].kill()
    try:

        def renewed_under_a_new_bucket_leader() -> bool:
            try:
                _, rev, where = _lease_and_bucket_leader(cluster)
            except Exception:
                return False  # electing
            return where not in (None, bucket_leader) and rev > revision

        wait_for(renewed_under_a_new_bucket_leader, timeout=60, interval=0.5)
        after, _, _ = _lease_when_readable(cluster)
        assert after.holder == leader
        assert cluster.leader() == leader
        leaders_after = _leader_records(api)
        assert leaders_after == leaders_before
    finally:
        nats.restart(victim)


def test_a_standby_never_writes_the_log(cluster: LocalCluster) -> None:
    """SIGSTOP the leader past its lease: a standby takes office; when the old leader
    wakes it finds the lease gone and steps down without a write (its appends would be
    refused: the log moved on)."""
    api = cluster.api()
    old = cluster.leader()
    assert old is not None
    cluster.procs[old].send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: cluster.leader() not in (None, old), timeout=45)
        register(api, "c1", "cloud", "agent-c1b", cluster)
    finally:
        cluster.procs[old].send_signal(signal.SIGCONT)
    old_url = cluster.coordinator_urls[old]
    wait_for(lambda: httpx.get(f"{old_url}/healthz").json()["role"] == "standby", timeout=15)
    leaders = [
        r for r in api.call("GET", "/api/v1/cluster/log?limit=1000") if r["kind"] == "leader"
    ]
    assert [r["epoch"] for r in leaders] == list(range(1, len(leaders) + 1))
    wait_for(lambda: view(Api(old_url, None)) == view(api), timeout=10)


def test_every_stream_and_bucket_has_three_copies(cluster: LocalCluster) -> None:
    """Nothing single-copy on a three-server cluster: the control log and buckets the
    coordinators made, and everything agents, runners and the registries make on
    first use with their defaults (fences, last assignments, models, rule sets, pins,
    data and dead-letter streams)."""
    from spanflow.cep.rule_store import RuleStore
    from spanflow.ml.model_store import ModelStore
    from spanflow.nats.cluster import ensure_kv
    from spanflow.nats.fences import fences
    from spanflow.nats.streams import SyncNats, ensure_stream
    from spanflow.protocol.names import MODEL_PINS_BUCKET, RULE_PINS_BUCKET
    from spanflow.runtime.last_known import LAST_ASSIGNMENTS_BUCKET
    from spanflow.store.pins import Pins

    client = SyncNats(cluster.nats_url)
    try:

        async def make_and_list() -> dict[str, int]:
            js = client.js
            await fences(js)
            await ensure_kv(js, LAST_ASSIGNMENTS_BUCKET)
            models = ModelStore(js)  # each store makes its buckets on first use
            await models.names()
            await models.files.get("none")
            await models.publication_request("none")
            await RuleStore(js).names()
            for pins in (RULE_PINS_BUCKET, MODEL_PINS_BUCKET):
                await Pins(js, pins).get("none")
            await ensure_stream(js, "HA_DATA", ["hadata.>"])
            return {
                s.config.name or "": s.config.num_replicas or 1 for s in await js.streams_info()
            }

        copies = client.run(make_and_list)
    finally:
        client.close()
    expected = {
        "SPANFLOW_WAL", "SPANFLOW_ACTIVITY", "KV_spanflow_leader", "KV_spanflow_fences",
        "KV_spanflow_nodes", "KV_spanflow_assignments", "KV_spanflow_last_assignments",
        "OBJ_SPANFLOW_SNAPSHOTS",
        "OBJ_SPANFLOW_MODELS", "KV_SPANFLOW_RULES", "HA_DATA",
    }  # fmt: skip
    assert expected <= set(copies)
    assert {name: n for name, n in copies.items() if n != 3} == {}
