"""The score step on real Spark: registry models scored where the step runs, swapped
at a batch boundary when production moves (no restart, nothing lost or repeated),
a misfit version refused while the previous one keeps scoring, a shadow beside."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from skl2onnx import to_onnx
from sklearn.linear_model import LogisticRegression

import spanflow as sf
from spanflow.errors import CompileError
from spanflow.ml.model_store import ModelStore, with_store
from spanflow.spark.runner import PipelineRunner
from tests.helpers import publish, read_all, read_records, wait_for

SCHEMA = {"id": "long", "device": "string", "t": "double", "v": "double"}


def _onnx(width: int, flip: bool) -> bytes:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, width)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0) ^ flip
    return to_onnx(LogisticRegression().fit(x, y), x[:1]).SerializeToString()


def _registry(url: str, work) -> object:  # type: ignore[no-untyped-def]
    return asyncio.run(with_store(url, work))


def _records(lo: int, hi: int) -> list[dict]:
    rng = np.random.default_rng(lo)
    return [
        {"id": i, "device": f"d{i % 4}", "t": float(rng.normal()), "v": float(rng.normal())}
        for i in range(lo, hi)
    ]


def test_hot_swap_misfit_refused_and_shadow(spark, nats_url, checkpoints, uid, tmp_path: Path):
    name = f"m-{uid}"

    async def setup(store: ModelStore) -> None:
        await store.push(name, _onnx(2, False), format="onnx", features=["t", "v"])
        await store.push(name, _onnx(2, True), format="onnx", features=["t", "v"])
        await store.promote(name, 1)

    _registry(nats_url, setup)
    p = sf.Pipeline(f"score-{uid}", trigger=0)
    flow = (
        p.source(f"IN_{uid}", schema=SCHEMA, key="device", max_rows_per_batch=7)
        .score(name, prediction_type="boolean", shadow=True)
        .sink_jetstream(f"OUT_{uid}", subject=f"out{uid}")
    )
    publish(nats_url, f"IN_{uid}", f"in{uid}.r", _records(0, 20))
    runner = PipelineRunner(
        spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints, functions=flow.functions
    ).start()

    def settled(n: int) -> None:
        wait_for(lambda: len(read_all(nats_url, f"OUT_{uid}")) >= n, timeout=180)
        runner.await_idle()

    try:
        settled(20)
        _registry(nats_url, lambda store: store.promote(name, 2))  # hot swap
        publish(nats_url, f"IN_{uid}", f"in{uid}.r", _records(20, 40))
        settled(40)

        async def misfit(store: ModelStore) -> None:  # reads a field the stream lacks
            await store.push(name, _onnx(3, False), format="onnx", features=["t", "v", "w"])
            await store.promote(name, 3)

        _registry(nats_url, misfit)
        publish(nats_url, f"IN_{uid}", f"in{uid}.r", _records(40, 60))
        settled(60)
    finally:
        runner.stop()
    rows = {r["id"]: r for r in read_records(nats_url, f"OUT_{uid}")}
    assert sorted(rows) == list(range(60)) and len(read_all(nats_url, f"OUT_{uid}")) == 60
    for i, r in rows.items():
        positive = r["t"] + r["v"] > 0
        version = 1 if i < 20 else 2  # the misfit version 3 never scores
        assert r["model_version"] == version, r
        if abs(r["t"] + r["v"]) > 0.3:  # clear of the learnt boundary
            assert r["prediction"] == (positive if version == 1 else not positive), r
        assert 0.5 <= r["probability"] <= 1
        # shadow: the staging version (2 while 1 is in production; none after)
        assert (r["shadow_version"], r["shadow_prediction"] is None) == (
            (2, False) if i < 20 else (None, True)
        ), r


def test_a_model_missing_or_not_fitting_the_stream_is_refused_at_start(spark, nats_url, uid):
    p = sf.Pipeline(f"nomodel-{uid}")
    flow = p.source(f"IN_{uid}", schema=SCHEMA).score(f"absent-{uid}").sink_console()
    with pytest.raises(CompileError, match=f"no model 'absent-{uid}'"):
        PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir="/tmp/x").start()
    name = f"wide-{uid}"
    _registry(
        nats_url,
        lambda store: _push_and_promote(store, name, _onnx(3, False), ["t", "v", "w"]),
    )
    flow = p.source(f"IN_{uid}", schema=SCHEMA).score(name).sink_console()
    with pytest.raises(CompileError, match=r"has no \['w'\]"):
        PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir="/tmp/x").start()


async def _push_and_promote(store: ModelStore, name: str, data: bytes, features: list[str]) -> None:
    await store.push(name, data, format="onnx", features=features)
    await store.promote(name, 1)
