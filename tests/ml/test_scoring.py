"""Which version scores a batch (real NATS, no Spark): pinned per batch, the same on
replay, swapped at the next batch, a misfit refused; canary and shadow routing."""

from __future__ import annotations

import asyncio
import pickle

import pytest
from river import linear_model

from spanflow.errors import InvalidModel
from spanflow.ml.artifacts import LoadedModel
from spanflow.ml.model_store import ModelStore, with_store
from spanflow.ml.scoring import Pinning, models_for_batch
from spanflow.spark.scoring_udf import ScoreSettings, in_canary, score_columns, score_records


def _river(slope: float) -> bytes:
    model = linear_model.LinearRegression(intercept_lr=0.0)
    for i in range(200):
        model.learn_one({"t": i / 100}, slope * i / 100)
    return pickle.dumps(model)


def _store(url: str, work):  # type: ignore[no-untyped-def]
    return asyncio.run(with_store(url, work))


def test_one_version_per_batch_swapped_at_the_next_batch(nats_url, uid):
    name = f"lin-{uid}"

    async def setup(store: ModelStore) -> None:
        await store.push(name, _river(1.0), format="river", features=["t"])
        await store.push(name, _river(-1.0), format="river", features=["t"])
        await store.push(name, _river(2.0), format="river", features=["t", "missing"])
        await store.promote(name, 1)

    _store(nats_url, setup)
    pin = Pinning(f"p-{uid}", "score", name, {"t": "double"})

    def version(batch: str) -> int | None:
        model = models_for_batch(nats_url, pin, ["production"], batch)["production"]
        return None if model is None else model.version

    assert version("0") == 1
    _store(nats_url, lambda store: store.promote(name, 2))
    assert version("0") == 1  # batch 0 replayed: the version it had
    assert version("1") == 2  # the next batch: the new one
    _store(nats_url, lambda store: store.promote(name, 3))  # reads a field the stream lacks
    assert version("2") == 2  # refused: the previous version keeps scoring
    model = models_for_batch(nats_url, pin, ["production"], "3")["production"]
    assert model is not None and model.predict([{"t": 1.0}])[0][0] == pytest.approx(-1.0, abs=0.05)
    with pytest.raises(InvalidModel, match=r"has no \['missing'\]"):  # at start: said at once
        models_for_batch(
            nats_url, Pinning(f"q-{uid}", "s", name, {"t": "double"}), ["production"], "start"
        )


class _Const:
    def __init__(self, value: float) -> None:
        self.value = value

    def predict_one(self, x: dict) -> float:
        if x.get("t") is None:
            raise ValueError("no t")
        return self.value


def test_canary_and_shadow_routing():
    main = LoadedModel(1, ("t",), "river", _Const(1.0))
    staging = LoadedModel(2, ("t",), "river", _Const(2.0))
    settings = ScoreSettings(
        url="",
        pin=Pinning("p", "s", "m", {}),
        stage="production",
        shadow=True,
        canary=0.25,
        canary_key="device",
        prediction_type="double",
        columns=(),
        pipeline="p",
        step="s",
    )
    records = [{"device": f"d{i}", "t": 1.0} for i in range(200)] + [{"device": "x", "t": None}]
    out = score_records(settings, records, main, staging)
    assert isinstance(out[-1], ValueError)  # a record the model cannot score
    for record, added in zip(records[:-1], out[:-1], strict=True):
        canary = in_canary(record["device"], 0.25)
        assert added["model_version"] == (2 if canary else 1)
        assert added["prediction"] == (2.0 if canary else 1.0)
        assert (added["shadow_version"], added["shadow_prediction"]) == (2, 2.0)
    share = sum(a["model_version"] == 2 for a in out[:-1]) / 200
    assert 0.15 < share < 0.35


def test_whole_arrow_batches_score_like_records_one_by_one():
    import numpy as np
    import pyarrow as pa
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    from spanflow.ml.artifacts import _onnx_session

    rng = np.random.default_rng(9)
    x = rng.normal(size=(300, 2)).astype(np.float32)
    data = to_onnx(LogisticRegression().fit(x, x[:, 0] > x[:, 1]), x[:1]).SerializeToString()
    main = LoadedModel(3, ("t", "v"), "onnx", _onnx_session(data))
    staging = LoadedModel(4, ("v", "t"), "onnx", _onnx_session(data))  # other feature order
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("t", pa.float64()),
            ("v", pa.float64()),
            ("prediction", pa.bool_()),
            ("probability", pa.float64()),
            ("model_version", pa.int64()),
            ("shadow_prediction", pa.bool_()),
            ("shadow_version", pa.int64()),
        ]
    )
    settings = ScoreSettings(
        url="",
        pin=Pinning("p", "s", "m", {}),
        stage="production",
        shadow=True,
        canary=None,
        canary_key=None,
        prediction_type="boolean",
        columns=tuple(schema.names),
        pipeline="p",
        step="s",
    )
    records = [{"id": i, "t": float(a), "v": float(b)} for i, (a, b) in enumerate(x[:50])]
    records[7]["v"] = None  # a missing value scores as NaN on both paths
    batch = pa.RecordBatch.from_pylist(records, schema=pa.schema(list(schema)[:3]))
    fast = score_columns(settings, batch, main, staging, schema)
    assert fast is not None
    slow = score_records(settings, records, main, staging)
    expected = [{**r, **added} for r, added in zip(records, slow, strict=True)]
    assert fast.to_pylist() == expected
    assert {r["shadow_version"] for r in expected} == {4}
    canary = ScoreSettings(**{**settings.__dict__, "canary": 0.5, "canary_key": "id"})
    assert score_columns(canary, batch, main, staging, schema) is None  # per record instead
