"""The model registry end to end on a real NATS server, through the CLI: push, list,
promote, rollback; files verified by sha256 when loaded; clear errors."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import numpy as np
import pytest
from river import linear_model
from skl2onnx import to_onnx
from sklearn.linear_model import LogisticRegression
from typer.testing import CliRunner

import spanflow as sf
from spanflow.cli import app
from spanflow.errors import InvalidModel, ModelError, ModelNotFound
from spanflow.ml import registry
from spanflow.ml.model_store import ModelStore, with_store

runner = CliRunner()


def _onnx_model(path: Path, flip: bool = False) -> Path:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 2)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0) ^ flip
    model = LogisticRegression().fit(x, y)
    path.write_bytes(to_onnx(model, x[:1]).SerializeToString())
    return path


def _cli(*args: str) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _manifest(url: str, name: str) -> registry.ModelManifest:
    async def work(store: ModelStore) -> registry.ModelManifest:
        return (await store.manifest(name))[0]

    return asyncio.run(with_store(url, work))  # type: ignore[return-value]


def test_push_list_promote_rollback_and_load(nats_url, tmp_path, uid):
    name = f"pump-{uid}"
    first = _onnx_model(tmp_path / "a.onnx")
    second = _onnx_model(tmp_path / "b.onnx", flip=True)
    assert "version 1" in _cli(
        "model", "push", str(first), "--name", name, "--features", "t,v", "--nats", nats_url
    )
    assert "version 2" in _cli(
        "model", "push", str(second), "--name", name, "--features", "t,v", "--nats", nats_url
    )
    _cli("model", "promote", name, "1", "--nats", nats_url)
    _cli("model", "promote", name, "2", "--nats", nats_url)
    manifest = _manifest(nats_url, name)
    assert [(v.version, v.stage) for v in manifest.versions] == [(1, "archived"), (2, "production")]
    assert manifest.version(1).inputs == {"t": "double", "v": "double"}
    listing = _cli("model", "list", name, "--nats", nats_url)
    assert "production" in listing and "archived" in listing
    assert "version 1 again" in _cli("model", "rollback", name, "--nats", nats_url)
    manifest = _manifest(nats_url, name)
    assert manifest.production == 1 and manifest.version(2).stage == "archived"

    async def score(store: ModelStore) -> list:
        loaded = [await store.load(name, manifest.version(n)) for n in (1, 2)]
        records = [{"t": 2.0, "v": 1.0}, {"t": -2.0, "v": -1.0}]
        return [m.predict(records) for m in loaded]

    one, two = asyncio.run(with_store(nats_url, score))
    assert [label for label, _ in one] == [True, False]  # x0 + x1 > 0
    assert [label for label, _ in two] == [False, True]  # the flipped model
    assert all(0.5 <= p <= 1 for _, p in one + two)


def test_a_river_model_round_trips_and_a_changed_file_is_refused(nats_url, tmp_path, uid):
    name = f"river-{uid}"
    model = linear_model.LinearRegression()
    for i in range(50):
        model.learn_one({"t": float(i)}, 2.0 * i)
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps(model))
    _cli("model", "push", str(path), "--name", name, "--features", "t", "--nats", nats_url)
    version = _manifest(nats_url, name).version(1)

    async def load(store: ModelStore):  # type: ignore[no-untyped-def]
        return await store.load(name, version)

    loaded = asyncio.run(with_store(nats_url, load))
    assert loaded.predict([{"t": 10.0}])[0][0] == model.predict_one({"t": 10.0})
    tampered = version.model_copy(update={"sha256": "0" * 64})

    async def load_tampered(store: ModelStore):  # type: ignore[no-untyped-def]
        data = await store.file(name, version)
        from spanflow.ml.artifacts import load as load_file

        return load_file(tampered, data)

    with pytest.raises(InvalidModel, match="sha256"):
        asyncio.run(with_store(nats_url, load_tampered))


def test_bad_files_and_unknown_versions_give_clear_errors(nats_url, tmp_path, uid):
    name = f"bad-{uid}"
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(InvalidModel, match="not a valid ONNX model"):
        runner.invoke(
            app,
            ["model", "push", str(junk), "--name", name, "--features", "t", "--nats", nats_url],
            catch_exceptions=False,
        )
    good = _onnx_model(tmp_path / "m.onnx")
    with pytest.raises(InvalidModel, match="reads 2 columns but 3 features"):
        runner.invoke(
            app,
            ["model", "push", str(good), "--name", name, "--features", "a,b,c", "--nats", nats_url],
            catch_exceptions=False,
        )
    with pytest.raises(ModelNotFound, match=f"no model '{name}'"):
        runner.invoke(
            app, ["model", "promote", name, "1", "--nats", nats_url], catch_exceptions=False
        )
    _cli("model", "push", str(good), "--name", name, "--features", "a,b", "--nats", nats_url)
    with pytest.raises(ModelNotFound, match=r"has no version 7 \(versions: 1\)"):
        runner.invoke(
            app, ["model", "promote", name, "7", "--nats", nats_url], catch_exceptions=False
        )
    _cli("model", "promote", name, "1", "--nats", nats_url)
    with pytest.raises(ModelError, match="nothing to roll back to"):
        runner.invoke(app, ["model", "rollback", name, "--nats", nats_url], catch_exceptions=False)


def test_registry_decisions():
    m = None
    for i in range(3):
        m = registry.add_version(
            m, "m", sha256=f"{i:064x}", format="onnx", inputs={"t": "double"}, size=1, now=i
        )
    assert [v.version for v in m.versions] == [1, 2, 3]
    assert all(v.stage == "staging" for v in m.versions)
    m = registry.promote(registry.promote(registry.promote(m, 1), 2), 3)
    assert (m.production, m.history) == (3, (1, 2))
    m = registry.rollback(m)
    assert (m.production, m.history, m.version(3).stage) == (2, (1,), "archived")
    m = registry.rollback(m)
    assert (m.production, m.history) == (1, ())
    with pytest.raises(ModelError):
        registry.rollback(m)
    with pytest.raises(ModelError, match="model name"):
        registry.check_name("no spaces please")


def test_rest_endpoints_need_the_token_and_work_end_to_end(tmp_path):
    import warnings

    from spanflow.nats.server import EmbeddedNats
    from spanflow.server.app import create_app
    from tests.cluster.test_coordinator_api import AUTH, coordinator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    data = _onnx_model(tmp_path / "m.onnx").read_bytes()
    with (
        EmbeddedNats(tmp_path / "nats") as server,
        TestClient(create_app(coordinator(server, tmp_path))) as api,
    ):
        url = "/api/v1/models/pump/versions?format=onnx&features=t,v"
        assert api.post(url, content=data).status_code == 401  # no token, no upload
        assert api.get("/api/v1/models").status_code == 401
        for _ in range(2):
            r = api.post(url, content=data, headers=AUTH)
            assert r.status_code == 201, r.text
        assert r.json()["version"] == 2 and r.json()["stage"] == "staging"
        r = api.post("/api/v1/models/pump/promote", json={"version": 2}, headers=AUTH)
        assert r.status_code == 200 and r.json()["production"] == 2
        r = api.post("/api/v1/models/pump/promote", json={"version": 1}, headers=AUTH)
        assert r.json()["production"] == 1
        r = api.post("/api/v1/models/pump/rollback", headers=AUTH)
        assert r.json()["production"] == 2
        listed = api.get("/api/v1/models", headers=AUTH).json()
        assert [(m["name"], m["production"]) for m in listed] == [("pump", 2)]
        # errors: a missing version, an unknown model, a bad file, a bad format
        r = api.post("/api/v1/models/pump/promote", json={"version": 9}, headers=AUTH)
        assert r.status_code == 404 and "has no version 9" in r.json()["detail"]
        assert api.get("/api/v1/models/nope", headers=AUTH).status_code == 404
        r = api.post(url, content=b"junk", headers=AUTH)
        assert r.status_code == 422 and "not a valid ONNX model" in r.json()["detail"]
        bad = "/api/v1/models/pump/versions?format=pickle&features=t"
        assert api.post(bad, content=data, headers=AUTH).status_code == 422
        # "publish now" requests for learn steps: numbered, increasing, token-protected
        assert api.post("/api/v1/models/edge/publish").status_code == 401
        first = api.post("/api/v1/models/edge/publish", headers=AUTH)
        second = api.post("/api/v1/models/edge/publish", headers=AUTH)
        assert first.status_code == 202 and second.json()["request"] > first.json()["request"]
        assert api.post("/api/v1/models/no%20good/publish", headers=AUTH).status_code == 422
        # Every change is in the control log, in order, with who asked; refusals are not.
        log = api.get("/api/v1/cluster/log?limit=1000", headers=AUTH).json()
        changes = [
            (e["detail"]["name"], e["detail"]["action"], e["detail"]["version"], e["detail"]["by"])
            for e in log
            if e["kind"] == "catalog-changed"
        ]
        assert [c[:3] for c in changes] == [
            ("pump", "push", 1),
            ("pump", "push", 2),
            ("pump", "promote", 2),
            ("pump", "promote", 1),
            ("pump", "rollback", 2),
            ("edge", "publish", None),
            ("edge", "publish", None),
        ]
        assert all(by for *_, by in changes)  # the token's principal


def test_a_models_needs_pin_the_pipelines_that_score_with_it(tmp_path):
    """What a model needs (accelerators, tags) is declared at push; a pipeline scoring
    with it is pinned to such nodes when submitted, and refused when none exists; a
    pipeline scoring with a model the registry lacks is refused with the reason."""
    import warnings

    from spanflow.nats.server import EmbeddedNats
    from spanflow.server.app import create_app
    from tests.cluster.test_coordinator_api import AUTH, coordinator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    pipeline = (
        "name: {name}\nsources:\n  - {{id: src, stream: IN_A, schema: {{t: double, v: double}}, "
        "to: [s]}}\nprocessors:\n  - {{id: s, type: score, model: {model}, to: [out]}}\n"
        "sinks:\n  - {{id: out, type: jetstream, stream: OUT_P, subject: out.p}}\n"
    )
    data = _onnx_model(tmp_path / "m.onnx").read_bytes()
    with (
        EmbeddedNats(tmp_path / "nats") as server,
        TestClient(create_app(coordinator(server, tmp_path))) as api,
    ):
        push = "/api/v1/models/pump/versions?format=onnx&features=t,v"
        r = api.post(push + "&accelerators=gpu&tags=line-a", content=data, headers=AUTH)
        assert r.status_code == 201, r.text
        manifest = api.get("/api/v1/models/pump", headers=AUTH).json()
        assert (manifest["accelerators"], manifest["tags"]) == (["gpu"], ["line-a"])

        body = {"yaml": pipeline.format(name="p1", model="pump")}
        r = api.post("/api/v1/pipelines", json=body, headers=AUTH)
        assert r.status_code == 422
        assert (
            "no node at site edge-a has tags ['line-a'] and accelerators ['gpu']"
            in (r.json()["detail"])
        )
        # A version pushed without needs keeps them; one pushed with empty lists clears them.
        assert api.post(push, content=data, headers=AUTH).status_code == 201
        assert api.get("/api/v1/models/pump", headers=AUTH).json()["accelerators"] == ["gpu"]
        r = api.post(push + "&accelerators=&tags=", content=data, headers=AUTH)
        assert r.status_code == 201
        r = api.post("/api/v1/pipelines", json=body, headers=AUTH)
        assert r.status_code in (200, 201), r.text

        body = {"yaml": pipeline.format(name="p2", model="nope")}
        r = api.post("/api/v1/pipelines", json=body, headers=AUTH)
        assert r.status_code == 422
        assert "scores with model 'nope', which is not in the registry" in r.json()["detail"]


def test_pin_to_model_needs_adds_to_the_steps_own_pins():
    spec = (
        sf.Pipeline("p")
        .source("S", schema={"t": "double"}, key="t")
        .score("m", id="scored")
        .on(tags=["site-x"])
        .sink_console()
        .spec()
    )
    needs = registry.ModelManifest(name="m", accelerators=("gpu",), tags=("site-x", "fast"))
    step = registry.pin_to_model_needs(spec, {"m": needs}).step("scored")
    assert (step.node_tags, step.node_accelerators) == (("site-x", "fast"), ("gpu",))
    assert registry.pin_to_model_needs(spec, {}).step("scored") == spec.step("scored")
    with pytest.raises(ModelError, match="a tag or accelerator"):
        registry.add_version(
            None, "m", sha256="ab" * 32, format="onnx", inputs={}, size=1, now=0, tags=["a b"]
        )
