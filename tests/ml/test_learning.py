"""Online learning without Spark: predictions and metrics equal a plain River loop,
however the records are cut into batches; unlabelled records are only predicted."""

from __future__ import annotations

import random

import pytest
from river import linear_model, metrics, preprocessing

import spanflow as sf
from spanflow.errors import ModelNotFound, SpecError
from spanflow.ml.learning import Learner, OnlineLearning
from spanflow.testing import KeyedProcessorTest

FEATURES = ("x1", "x2")


def _records(n: int) -> list[dict]:
    rng = random.Random(11)
    out = []
    for i in range(n):
        x1, x2 = rng.gauss(0, 1), rng.gauss(5, 2)
        label = (x1 + 0.3 * (x2 - 5) + rng.gauss(0, 0.3)) > 0
        out.append(
            {
                "id": i,
                "device": "ab"[i % 2],
                "x1": x1,
                "x2": x2,
                "label": None if i % 10 == 9 else label,  # every tenth has no label yet
                "y": 3 * x1 - x2 + rng.gauss(0, 0.1),
            }
        )
    return out


def _river_classifier(records: list[dict]) -> list[tuple]:
    model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    accuracy, f1, learned, out = metrics.Accuracy(), metrics.F1(), 0, []
    for r in records:
        x = {f: r[f] for f in FEATURES}
        prediction = model.predict_one(x)
        probability = model.predict_proba_one(x)[prediction]
        if r["label"] is not None:
            accuracy.update(r["label"], prediction)
            f1.update(r["label"], prediction)
            model.learn_one(x, r["label"])
            learned += 1
        out.append((prediction, probability, accuracy.get(), f1.get(), learned))
    return out


def _learner(target: str = "label", model: str = "river:linear_model.LogisticRegression"):
    return lambda: Learner(model, FEATURES, target, {}, "standard", target == "label")


def _test(publish: object = None) -> KeyedProcessorTest:
    return KeyedProcessorTest(
        OnlineLearning,
        key="device",
        output_schema={
            "id": "long",
            "device": "string",
            "prediction": "boolean?",
            "probability": "double?",
            "accuracy": "double",
            "f1": "double",
            "learned": "long",
        },
        params={"learner": _learner(), "hidden": ("x1", "x2", "label", "y"), "publish": publish},
    )


def test_predictions_and_metrics_equal_a_plain_river_loop_however_batches_are_cut():
    records = _records(400)
    out = []
    t = _test()
    for lo in range(0, len(records), 23):
        out += t.process(records[lo : lo + 23])
    for device in "ab":
        mine = [r for r in records if r["device"] == device]
        got = sorted((r for r in out if r["device"] == device), key=lambda r: r["id"])
        expected = _river_classifier(mine)
        assert [
            (r["prediction"], r["probability"], r["accuracy"], r["f1"], r["learned"]) for r in got
        ] == expected
    assert got[-1]["accuracy"] > 0.8  # it did learn
    assert got[-1]["learned"] == sum(1 for r in mine if r["label"] is not None)


def test_a_regressor_reports_mae_and_rmse_like_river():
    records = _records(300)
    learner = Learner("river:linear_model.LinearRegression", FEATURES, "y", {}, "standard", False)
    model, kept, _ = learner.load(None)
    model = learner.load(learner.save(model, kept, 0))[0]  # a round trip on the way
    river_model = preprocessing.StandardScaler() | linear_model.LinearRegression()
    mae = metrics.MAE()
    for r in records:
        prediction, _, learnt = learner.step(model, kept, r)
        x = {f: r[f] for f in FEATURES}
        expected = river_model.predict_one(x)
        mae.update(r["y"], expected)
        river_model.learn_one(x, r["y"])
        assert learnt and prediction == expected
    assert kept[0].get() == mae.get() and learner.metric_names == ("mae", "rmse")


def test_learn_errors_are_clear():
    p = sf.Pipeline("bad")
    s = p.source("S", schema={"device": "string", "x1": "double", "label": "boolean"})
    with pytest.raises(SpecError, match="model"):
        s.learn("sklearn:LogisticRegression", features=["x1"], target="label")
    with pytest.raises(SpecError, match="cannot also be a feature"):
        s.learn("river:linear_model.LogisticRegression", features=["x1", "label"], target="label")
    with pytest.raises(ValueError, match=r"River has no linear_model\.Nope"):
        _learner(model="river:linear_model.Nope")()
    with pytest.raises(ValueError, match="neither a River classifier nor a regressor"):
        _learner(model="river:preprocessing.StandardScaler")()


def test_a_learnt_model_is_published_to_the_registry_once_per_change(nats_url, uid):
    import asyncio

    from spanflow.ml.artifacts import load
    from spanflow.ml.learning import Publishing, publish_model
    from spanflow.ml.model_store import ModelStore, with_store

    learner = Learner("river:linear_model.LinearRegression", FEATURES, "y", {}, "standard", False)
    model, kept, n = learner.load(None)
    for r in _records(100):
        n += learner.step(model, kept, r)[2]
    settings = Publishing(url=nats_url, name=f"edge-{uid}", every=0, per_key=True, origin="p/s")
    assert publish_model(settings, "dev/1", model, FEATURES, n) == 1
    assert publish_model(settings, "dev/1", model, FEATURES, n) is None  # same file: no new version
    learner.step(model, kept, _records(101)[-1])
    assert publish_model(settings, "dev/1", model, FEATURES, n + 1) == 2

    async def fetch(store: ModelStore):  # type: ignore[no-untyped-def]
        manifest, _ = await store.manifest(f"edge-{uid}-dev_1")
        version = manifest.version(2)
        return version, await store.file(manifest.name, version)

    version, data = asyncio.run(with_store(nats_url, fetch))
    assert (version.stage, version.format) == ("staging", "river")
    assert "101 records" in version.note
    loaded = load(version, data)
    x = {"x1": 0.5, "x2": 4.0}
    assert loaded.predict([x])[0][0] == model.predict_one(x)


def test_models_are_published_on_demand_once_per_request(nats_url, uid, monkeypatch):
    """``publish_every: null`` publishes only when asked: ``spanflow model publish``
    makes every key's model a new staging version at its next batch, once."""
    import asyncio

    from typer.testing import CliRunner

    from spanflow.cli import app
    from spanflow.ml import learning
    from spanflow.ml.model_store import ModelStore, with_store

    monkeypatch.setattr(learning, "REQUEST_CACHE_SECONDS", 0.0)
    name = f"edge-{uid}"
    settings = learning.Publishing(url=nats_url, name=name, every=None, per_key=True, origin="p/s")
    t = _test(publish=settings)
    records = _records(120)

    async def versions(store: ModelStore) -> dict[str, int]:
        out = {}
        for key in ("a", "b"):
            try:
                manifest, _ = await store.manifest(f"{name}-{key}")
                out[key] = len(manifest.versions)
            except ModelNotFound:
                out[key] = 0
        return out

    def published() -> dict[str, int]:
        return asyncio.run(with_store(nats_url, versions))  # type: ignore[return-value]

    def ask() -> None:
        result = CliRunner().invoke(app, ["model", "publish", name, "--nats", nats_url])
        assert result.exit_code == 0 and "publish request" in result.output, result.output

    t.process(records[:30])
    assert published() == {"a": 0, "b": 0}  # not by time, not asked
    ask()
    t.process(records[30:60])
    assert published() == {"a": 1, "b": 1}
    t.process(records[60:90])
    assert published() == {"a": 1, "b": 1}  # the request is handled once
    ask()
    t.process(records[90:])
    assert published() == {"a": 2, "b": 2}
