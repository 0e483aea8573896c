"""Signed assignments: an assignment makes a node import and run code, and it lives in
a KV bucket of the application account. An agent stores a well-formed assignment of its
own making and has the server write it over another node's key (a DIRECT.GET aimed at
``$KV.spanflow_assignments.<node>.<fragment>``): the value lands — and the node refuses
it, because only the coordinators' key signs; what the coordinators project verifies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import KeyNotFoundError

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.control import records as r
from spanflow.control.log import ControlLog, projection
from spanflow.control.state import ClusterState
from spanflow.nats.cluster import ASSIGNMENTS_BUCKET
from spanflow.nats.server import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.runtime.assignments import AssignmentWatch
from spanflow.security.secrets import SECRETS_ENV, Secrets
from spanflow.security.signing import Signer, Unsigned, Verifier, new_key_pair, read_signed
from spanflow.spec.cluster import Assignment, Fragment

EVIL = load_pipeline_text(
    """
name: p
sources: [{id: s, stream: IN, schema: {v: long}, to: [m]}]
processors: [{id: m, type: map, function: "os:system", to: [out]}]
sinks: [{id: out, type: jetstream, stream: OUT, subject: out}]
""",
    "evil.yaml",
)


def _assignment(node: str = "n1") -> Assignment:
    fragment = Fragment(id="p-f1", pipeline="p", spec=EVIL)
    return Assignment(fragment=fragment, node=node, epoch=9, checkpoint_dir="/c")


def test_only_what_the_coordinators_signed_verifies() -> None:
    private, public = new_key_pair()
    signer, verifier = Signer(private), Verifier(public)
    value = _assignment().model_dump_json().encode()
    envelope = signer.envelope(value)
    assert envelope == signer.envelope(value)  # deterministic: the repair compares bytes
    assert read_signed(envelope, verifier) == value
    assert read_signed(envelope, None) == value and read_signed(value, None) == value
    with pytest.raises(Unsigned):
        read_signed(value, verifier)  # a plain value
    other = Signer(new_key_pair()[0]).envelope(value)
    with pytest.raises(Unsigned):
        read_signed(other, verifier)  # another key
    tampered = json.loads(envelope)
    tampered["signed"] = tampered["signed"].replace('"epoch":9', '"epoch":10')
    with pytest.raises(Unsigned):
        read_signed(json.dumps(tampered).encode(), verifier)


def test_a_forged_assignment_written_by_the_server_is_refused(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    signer, verifier = secrets.signer(), secrets.verifier()
    assert signer is not None and verifier is not None
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:

        async def scenario() -> None:
            control = await connect(server.url, identity=secrets.identity("control"))
            data = await connect(server.url, identity=secrets.identity("coordinator"))
            log = await ControlLog.open(control, data_nc=data, signer=signer)
            state = ClusterState()
            state.assignments["p-f1"] = _assignment()
            await log._repair(state)  # projects every key the state has
            kv = log.buckets[ASSIGNMENTS_BUCKET]
            genuine = (await kv.get("n1.p-f1")).value or b""
            assert Assignment.model_validate_json(read_signed(genuine, verifier)).epoch == 9
            assert await log._repair(state) == 0  # the signed projection is stable

            agent = await connect(server.url, identity=secrets.identity("agent"))
            ajs = agent.jetstream()
            await ajs.add_stream(StreamConfig(name="MINE", subjects=["mine.>"], allow_direct=True))
            forged = _assignment().model_copy(update={"epoch": 99})
            stored = await ajs.publish("mine.x", forged.model_dump_json().encode())
            request = json.dumps({"seq": stored.seq}).encode()
            await agent.publish(
                "$JS.API.DIRECT.GET.MINE", request, reply="$KV.spanflow_assignments.n1.p-f1"
            )
            await agent.flush()
            deadline = asyncio.get_running_loop().time() + 10
            while (await kv.get("n1.p-f1")).value == genuine:  # the server wrote it ...
                assert asyncio.get_running_loop().time() < deadline, "the attack did not land"
                await asyncio.sleep(0.05)
            landed = (await kv.get("n1.p-f1")).value or b""
            assert b'"epoch":99' in landed
            with pytest.raises(Unsigned):  # ... and the node does not run it
                read_signed(landed, verifier)
            assert await log._repair(state) == 1  # the coordinator puts its own back
            assert (await kv.get("n1.p-f1")).value == genuine
            for nc in (agent, control, data):
                await nc.close()

        asyncio.run(scenario())


def test_projection_signs_assignments_only() -> None:
    signer = Signer(new_key_pair()[0])
    state = ClusterState()
    state.assignments["p-f1"] = _assignment()
    signed = projection(state, signer)
    plain = projection(state)
    assert signed[(ASSIGNMENTS_BUCKET, "n1.p-f1")] != plain[(ASSIGNMENTS_BUCKET, "n1.p-f1")]
    others = {k: v for k, v in signed.items() if k[0] != ASSIGNMENTS_BUCKET}
    assert others == {k: v for k, v in plain.items() if k[0] != ASSIGNMENTS_BUCKET}
    _ = r  # records are what the log carries; the projection is derived from the state


def test_a_forged_delete_of_an_assignment_is_noticed_and_put_back(tmp_path: Path) -> None:
    """No signature covers a delete: an agent has the server delete another node's
    assignment (a stored ``KV-Operation: DEL`` fetched by DIRECT.GET with the key's
    subject as reply-to). The leader notices a change it did not make and puts it back."""
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:

        async def scenario() -> None:
            control, data, log = await _leader(server.url, secrets)
            state = ClusterState()
            state.assignments["p-f1"] = _assignment()
            log.guard(leading=True)
            await log.repair_if_needed(state)  # a new leader checks every key once
            kv = log.buckets[ASSIGNMENTS_BUCKET]
            genuine = (await kv.get("n1.p-f1")).value
            assert genuine and log.tampered == 0

            agent = await connect(server.url, identity=secrets.identity("agent"))
            ajs = agent.jetstream()
            await ajs.add_stream(StreamConfig(name="MINE", subjects=["mine.>"], allow_direct=True))
            stored = await ajs.publish("mine.x", b"", headers={"KV-Operation": "DEL"})
            request = json.dumps({"seq": stored.seq}).encode()
            await agent.publish(
                "$JS.API.DIRECT.GET.MINE", request, reply="$KV.spanflow_assignments.n1.p-f1"
            )
            await agent.flush()
            deadline = asyncio.get_running_loop().time() + 10
            while log.tampered == 0:  # the delete landed, and the leader saw it
                assert asyncio.get_running_loop().time() < deadline, "the delete went unseen"
                await asyncio.sleep(0.05)
            with pytest.raises(KeyNotFoundError):
                await kv.get("n1.p-f1")
            await log.repair_if_needed(state)  # the leader's next lease pass
            assert (await kv.get("n1.p-f1")).value == genuine
            log.guard(leading=False)  # a follower leaves the projection to the leader
            await kv.put("n1.p-f1", b"the new leader's")
            await asyncio.sleep(0.3)  # nothing to poll for: the counter must stay
            assert log.tampered == 1
            for nc in (agent, control, data):
                await nc.close()

        asyncio.run(scenario())


def test_a_forged_rollup_or_a_purge_of_the_projection_is_noticed_and_rebuilt(
    tmp_path: Path,
) -> None:
    """One stored message with ``Nats-Rollup: all``, fetched by DIRECT.GET with a reply
    subject inside the assignments bucket, has the server wipe every key; a purge
    through the stream API tells nobody at all. The leader notices both and puts every
    key back at its next lease pass."""
    state = ClusterState()
    for node in ("n1", "n2", "n3"):
        assignment = _assignment(node)
        fragment = assignment.fragment.model_copy(update={"id": f"p-{node}"})
        state.assignments[f"p-{node}"] = assignment.model_copy(update={"fragment": fragment})
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    with EmbeddedNats(tmp_path / "nats", secrets=secrets) as server:

        async def scenario() -> None:
            control, data, log = await _leader(server.url, secrets)
            log.guard(leading=True)
            await log.repair_if_needed(state)
            kv = log.buckets[ASSIGNMENTS_BUCKET]
            genuine = {k: (await kv.get(k)).value for k in await kv.keys()}
            assert len(genuine) == 3 and log.tampered == 0

            agent = await connect(server.url, identity=secrets.identity("agent"))
            ajs = agent.jetstream()
            await ajs.add_stream(StreamConfig(name="MINE", subjects=["mine.>"], allow_direct=True,
                                              allow_rollup_hdrs=True))  # fmt: skip
            rollup = {"Nats-Rollup": "all", "KV-Operation": "PURGE"}
            stored = await ajs.publish("mine.x", b"", headers=rollup)
            request = json.dumps({"seq": stored.seq}).encode()
            await agent.publish(
                "$JS.API.DIRECT.GET.MINE", request, reply="$KV.spanflow_assignments.zz"
            )
            await agent.flush()
            await _until_tampered(log, 1)
            await log.repair_if_needed(state)
            assert {k: (await kv.get(k)).value for k in await kv.keys()} == genuine

            await data.jetstream().purge_stream(f"KV_{ASSIGNMENTS_BUCKET}")  # no message
            await log.repair_if_needed(state)  # the next lease pass counts the keys
            assert log.tampered == 2
            assert {k: (await kv.get(k)).value for k in await kv.keys()} == genuine
            for nc in (agent, control, data):
                await nc.close()

        asyncio.run(scenario())


async def _leader(url: str, secrets: Secrets) -> tuple[Any, Any, ControlLog]:
    """The control and data connections of a coordinator, and its control log."""
    control = await connect(url, identity=secrets.identity("control"))
    data = await connect(url, identity=secrets.identity("coordinator"))
    return control, data, await ControlLog.open(control, data_nc=data, signer=secrets.signer())


async def _until_tampered(log: ControlLog, count: int) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while log.tampered < count:
        assert asyncio.get_running_loop().time() < deadline, "the change went unseen"
        await asyncio.sleep(0.05)


def test_a_genuine_assignment_copied_onto_another_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server can be made to copy a stored KV message onto any key (a DIRECT.GET of
    the bucket's own stream with that key's subject as reply-to): another node's genuine,
    signed assignment would land under this node's key. The node runs an assignment only
    under the key it was signed for."""
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    signer = secrets.signer()
    assert signer is not None
    monkeypatch.setenv(SECRETS_ENV, str(secrets.root))
    watch = AssignmentWatch("n1")
    theirs = signer.envelope(_assignment("n2").model_dump_json().encode())
    with pytest.raises(Unsigned, match=r"signed for n2\.p-f1"):
        watch.parse("n1.p-f1", theirs)
    mine = signer.envelope(_assignment("n1").model_dump_json().encode())
    assert watch.parse("n1.p-f1", mine).epoch == 9
    with pytest.raises(Unsigned):
        watch.parse("n1.other", mine)
