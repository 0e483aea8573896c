"""``spanflow detector fit`` on real Spark and NATS: a normal per key fitted from the
history a pipeline stored, pushed, promoted, used by the running pipeline from its next
batch (scores equal to the fitted detector's own), replaced by a second version and
rolled back; the history read without touching the pipeline's consumer or dead
letters; a fit SIGKILLed half way leaves the registry as it was."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

import spanflow as sf
from spanflow.ml.fitted import detector_step
from spanflow.ml.model_store import with_store
from spanflow.ml.multivariate import MultivariateDetector
from spanflow.ml.normal import fit_normal
from spanflow.nats.streams import connect
from spanflow.spark.detector_fit import fit_detector
from spanflow.spark.runner import PipelineRunner
from spanflow.spec.pipeline import PipelineSpec
from tests.helpers import publish, read_all, read_records, wait_for

FIELDS = ("current", "flow", "temperature")
T0 = datetime(2026, 12, 1, tzinfo=UTC)
HISTORY = 300  # per key: fewer than the default warm-up (400), so online is still warming
SCHEMA = {"pump": "string", "ts": "timestamp", "id": "long", **dict.fromkeys(FIELDS, "double")}


def _readings(pump: str, start: int, n: int, flow: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    temperature = 60.0 + start * 0.001
    out = []
    for i in range(start, start + n):
        temperature += 0.001 + rng.gauss(0, 0.01)
        out.append(
            {
                "pump": pump,
                "id": i,
                "ts": (T0 + timedelta(seconds=i)).isoformat(),
                "current": round(10 + rng.gauss(0, 0.3), 4),
                "flow": round(flow + rng.gauss(0, 0.5), 4),
                "temperature": round(temperature, 4),
            }
        )
    return out


def _spec(uid: str) -> PipelineSpec:
    p = sf.Pipeline(f"fit-{uid}", trigger=0)
    return (
        p.source(f"PUMPS_{uid}", schema=SCHEMA, event_time="ts", id="readings")
        .key_by("pump")
        .detect_anomalies(list(FIELDS), id="watch")
        .sink_jetstream(f"SCORED_{uid}", subject=f"scored{uid}", id="out")
        .spec()
    )


def _store(url: str, work):
    return asyncio.run(with_store(url, work))


def _expected(normal, rows: list[dict]) -> list[tuple[float, bool]]:
    """Scores of the detector started from ``normal`` over ``rows``, as the step gives them."""
    detector = MultivariateDetector(FIELDS)
    live = detector.load(detector.started(normal))
    return [(score, score >= 0.5) for score, _ in (detector.step(live, r, None) for r in rows)]


def _scored(url: str, stream: str, pump: str, ids: range) -> list[tuple[float, bool]]:
    rows = {r["id"]: r for r in read_records(url, stream) if r["pump"] == pump}
    return [(rows[i]["anomaly_score"], rows[i]["is_anomaly"]) for i in ids]


def test_fit_push_promote_use_replace_and_roll_back(spark, nats_url, checkpoints, tmp_path, uid):
    stream, out = f"PUMPS_{uid}", f"SCORED_{uid}"
    history = _readings("a", 0, HISTORY, 32.0, 1) + _readings("b", 0, HISTORY, 50.0, 2)
    history += _readings("c", 0, 5, 40.0, 3)  # too few readings to fit
    publish(nats_url, stream, f"pumps{uid}.r", [*history, b"{not json"])
    spec = _spec(uid)
    runner = PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints).start()
    try:
        wait_for(lambda: len(read_all(nats_url, out)) >= len(history), timeout=240)
        dead = f"spanflow.dlq.{spec.instance}.>"
        before_letters = _count(nats_url, "SPANFLOW_DLQ", dead)

        step = detector_step(spec, "watch")
        end = T0 + timedelta(seconds=HISTORY)
        fitted = fit_detector(
            spark, spec, step, nats_url=nats_url, work=tmp_path / "fit1", start=T0, end=end
        )
        assert sorted(fitted.normals.keys) == ["a", "b"] and fitted.skipped == {"c": 5}
        for pump in ("a", "b"):  # the fit is the warm-up's fit, on the key's history
            rows = [[r[f] for f in FIELDS] for r in history if r["pump"] == pump]
            alone, _ = fit_normal(np.array(rows), FIELDS, smoothing=0.1, gain=0.8)
            assert fitted.normals.keys[pump].plain() == alone.plain()
        # it only looked: no second dead letter, no consumer of its own
        assert before_letters == 1
        assert _count(nats_url, "SPANFLOW_DLQ", dead) == before_letters
        assert _consumers(nats_url, stream) == {f"spanflow-{spec.instance}-readings"}

        name = step.model_name(spec.name)
        first = _push(nats_url, name, fitted.normals, promote=True)
        # live readings: a's flow drops from its 20th; online, a would still be warming up
        live = _readings("a", HISTORY, 120, 32.0, 4) + _readings("b", HISTORY, 120, 50.0, 5)
        for r in live[20:90]:
            r["flow"] -= 3.0
        sent = _send(nats_url, stream, uid, live, out, len(history))
        got_a = _scored(nats_url, out, "a", range(HISTORY, HISTORY + 120))
        assert got_a == _expected(fitted.normals.keys["a"], live[:120])
        assert any(flag for _, flag in got_a[20:40]) and not any(flag for _, flag in got_a[:20])
        got_b = _scored(nats_url, out, "b", range(HISTORY, HISTORY + 120))
        assert got_b == _expected(fitted.normals.keys["b"], live[120:])

        # a second fit (the first half of the history), promoted: each key starts from it
        half = fit_detector(
            spark, spec, step, nats_url=nats_url, work=tmp_path / "fit2", start=T0,
            end=T0 + timedelta(seconds=HISTORY // 2),
        )  # fmt: skip
        assert half.normals.keys["a"].plain() != fitted.normals.keys["a"].plain()
        second = _push(nats_url, name, half.normals, promote=True)
        assert second == first + 1
        mid = _readings("a", HISTORY + 120, 40, 32.0, 6)
        sent = _send(nats_url, stream, uid, mid, out, sent)
        got = _scored(nats_url, out, "a", range(HISTORY + 120, HISTORY + 160))
        assert got == _expected(half.normals.keys["a"], mid)
        # rolled back: version 1 again, each key afresh from it
        _store(nats_url, lambda s: s.rollback(name))
        more = _readings("a", HISTORY + 160, 40, 32.0, 7)
        _send(nats_url, stream, uid, more, out, sent)
        got = _scored(nats_url, out, "a", range(HISTORY + 160, HISTORY + 200))
        assert got == _expected(fitted.normals.keys["a"], more)
    finally:
        runner.stop()


def _push(url: str, name: str, normals, *, promote: bool) -> int:
    data = normals.to_bytes()
    pushed = _store(url, lambda s: s.push(name, data, format="normal", features=list(FIELDS)))
    if promote:
        _store(url, lambda s: s.promote(name, pushed.version))
    return int(pushed.version)


def _send(url: str, stream: str, uid: str, rows: list[dict], out: str, before: int) -> int:
    """Publish ``rows`` and wait until the pipeline has scored them: the new total."""
    publish(url, stream, f"pumps{uid}.r", rows)
    total = before + len(rows)
    wait_for(lambda: len(read_all(url, out)) >= total, timeout=240)
    return total


def _count(url: str, stream: str, subject: str) -> int:
    async def go() -> int:
        nc = await connect(url)
        try:
            info = await nc.jetstream().stream_info(stream, subjects_filter=subject)
            return sum((info.state.subjects or {}).values())
        except Exception:
            return 0
        finally:
            await nc.close()

    return asyncio.run(go())


def _consumers(url: str, stream: str) -> set[str]:
    async def go() -> set[str]:
        nc = await connect(url)
        try:
            return {c.name for c in await nc.jetstream().consumers_info(stream)}
        finally:
            await nc.close()

    return asyncio.run(go())


@pytest.mark.slow
def test_a_fit_killed_half_way_leaves_the_registry_as_it_was(nats_url, tmp_path, uid):
    stream = f"PUMPS_{uid}"
    history = [r for pump in "abcdefgh" for r in _readings(pump, 0, 2000, 32.0, ord(pump))]
    publish(nats_url, stream, f"pumps{uid}.r", history)
    spec = _spec(uid)
    spec_file = tmp_path / "pipeline.json"
    spec_file.write_text(spec.model_dump_json())
    name = detector_step(spec, "watch").model_name(spec.name)
    work = tmp_path / "tmp"
    work.mkdir()
    env = {**os.environ, "TMPDIR": str(work)}
    command = [sys.executable, "-m", "spanflow.cli", "detector", "fit", str(spec_file),
               "watch", "--nats", nats_url]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # killed once the job has started writing what it read of the history
        wait_for(lambda: any(work.glob("spanflow-fit-*/rows/*.parquet")), timeout=300)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    names = _store(nats_url, lambda s: s.names())
    assert name not in names
    # the same command run to the end pushes one staging version
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"pushed {name} version 1" in done.stdout
    manifest, _ = _store(nats_url, lambda s: s.manifest(name))
    assert [(v.version, v.stage, v.format) for v in manifest.versions] == [(1, "staging", "normal")]


TOPOLOGY = """
sites: [{{name: plant}}, {{name: cloud, kind: cloud}}]
nodes:
  - {{name: p1, site: plant, streams: [{{name: PUMPS_{uid}, subjects: ["pumps{uid}.>"]}}]}}
  - {{name: c1, site: cloud}}
links: [{{between: [plant, cloud], latency: 20ms}}]
"""


@pytest.mark.slow
def test_a_fit_started_through_the_rest_api_is_pushed_and_promoted_by_the_leader(tmp_path, uid):
    from fastapi.testclient import TestClient

    from spanflow.api.topology_loader import load_topology_text
    from spanflow.control.coordinator import Coordinator, CoordinatorSettings
    from spanflow.nats.server import EmbeddedNats
    from spanflow.server.app import create_app

    auth = {"Authorization": "Bearer secret"}
    with EmbeddedNats(tmp_path / "nats") as server:
        history = _readings("a", 0, HISTORY, 32.0, 1) + _readings("b", 0, HISTORY, 50.0, 2)
        publish(server.url, f"PUMPS_{uid}", f"pumps{uid}.r", history)
        settings = CoordinatorSettings(
            nats_url=server.url, state_dir=str(tmp_path / "state"), token="secret",
            topology=load_topology_text(TOPOLOGY.format(uid=uid)), heartbeat_interval=30.0,
        )  # fmt: skip
        spec = _spec(uid)
        with TestClient(create_app(Coordinator(settings))) as api:
            submitted = api.post("/api/v1/pipelines", json={"spec": spec.model_dump(mode="json")},
                                 headers=auth)  # fmt: skip
            assert submitted.status_code == 201, submitted.text
            base = f"/api/v1/pipelines/{spec.name}/detectors"
            wrong = api.post(f"{base}/nope/fit", json={}, headers=auth)
            assert wrong.status_code == 422 and "no detect_anomalies step" in wrong.text
            assert api.post(f"{base}/watch/fit", json={}).status_code == 401
            body = {"from": T0.isoformat(), "promote": True}
            started = api.post(f"{base}/watch/fit", json=body, headers=auth)
            assert started.status_code == 202 and started.json()["state"] == "running"
            again = api.post(f"{base}/watch/fit", json=body, headers=auth)
            assert again.status_code == 409  # one at a time
            wait_for(
                lambda: api.get(f"{base}/watch/fit", headers=auth).json()["state"] != "running",
                timeout=400,
            )
            job = api.get(f"{base}/watch/fit", headers=auth).json()
            assert job["state"] == "done", job["output"]
            assert (job["version"], job["promoted"], job["model"]) == (1, True, spec_model(spec))
            model = api.get(f"/api/v1/models/{job['model']}", headers=auth).json()
            assert model["production"] == 1 and model["versions"][0]["format"] == "normal"


def spec_model(spec: PipelineSpec) -> str:
    return detector_step(spec, "watch").model_name(spec.name)
